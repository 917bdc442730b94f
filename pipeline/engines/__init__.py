"""Engines: where a run's stages execute. The local engine is `local.run_score` (one stage over
the whole input, in this process); `dask` spreads the same stage over a Dask cluster (`pip
install 'ctxprec[dask]'`), with `keyed` judging each distinct key once."""

from ctxprec.engines.dask import INSTALL_HINT, TASK_ROWS, score_dask

__all__ = ["INSTALL_HINT", "TASK_ROWS", "score_dask"]
