"""Everything that talks across a boundary: judge providers, input readers, output sinks."""

__ctxprec__ = True  # this package is ctxprec's: the console script checks it (ctxprec_entry.py)

__all__: list[str] = []
