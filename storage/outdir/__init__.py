"""The output folder's state: commit records and part files, which files are ctxprec's, the run
manifest and lock, state files read back without trusting them, the scored dataset and its schema,
and the scratch of cluster and batch-API runs."""

__all__: list[str] = []
