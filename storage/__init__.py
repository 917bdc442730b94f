"""The pipeline's own state: memo, run manifest and part files, reports."""

__all__: list[str] = []
