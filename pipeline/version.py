"""ctxprec's version, written once: pyproject.toml reads it statically, `--version` prints it."""

__version__ = "0.3.0"
