"""ctxprec test suite."""
