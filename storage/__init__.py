"""The pipeline's own state, one room per job: the verdict memo (`memo`), the output folder's
state (`outdir`), file and object-store access with the layout of every path (`files`), what
people read (`report`), statistics (`stats`) and the leaf every layer shares (`core`)."""

__all__: list[str] = []
