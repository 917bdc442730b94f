"""Runs through a provider's batch API: scan the input, submit, collect, and the figures
(`ctxprec estimate --batch-api`)."""

__all__: list[str] = []
