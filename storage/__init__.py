"""The pipeline's own state: memo, run manifest and part files, reports."""

__ctxprec__ = True  # this package is ctxprec's: the console script checks it (ctxprec_entry.py)

__all__: list[str] = []
