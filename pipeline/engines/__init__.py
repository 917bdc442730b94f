"""Engines: where a run's stages execute. The local engine is `pipeline.entry.run_score` itself;
`dask` spreads the same stage over a Dask cluster (`pip install 'ctxprec[dask]'`)."""

from pipeline.engines.dask import INSTALL_HINT, TASK_ROWS, score_dask

__all__ = ["INSTALL_HINT", "TASK_ROWS", "score_dask"]
