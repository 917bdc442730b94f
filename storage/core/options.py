"""Options of one command that are not settings of the config file: `compare`'s and the
provider batch run's (`--batch-wait`, `--batch-fallback`). Each default is written once, here:
the parser (`ctxprec.cli.main`) shows and applies these defaults, and the Python API
(`compare_outputs(**options)`, `score_batch(batch=...)`) gets the same ones. Standard library
only, so the parser can read them without loading the code that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_RESAMPLES", "DEFAULT_ROUNDS", "BatchOptions", "CompareOptions"]

DEFAULT_RESAMPLES = 10_000  # bootstrap resamples of `compare` (as MLflow's compare_evaluations)
DEFAULT_ROUNDS = 8  # times a provider batch run sends its retryable lines again


@dataclass(frozen=True)
class CompareOptions:
    """`ctxprec compare`: how rows pair, how the intervals are resampled, what is shown."""

    on: str = "id"
    group_by: str | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    top: int = 10
    strict: bool = False
    cluster_by: str | None = None  # None: the query column when several pairs share a query
    margin: float | None = None  # non-inferiority: B no worse than A by more than this


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """`ctxprec score --batch-api`: how long to wait and where failed lines go again."""

    wait_s: float | None = None  # None: wait until every batch has ended
    fallback: str = "batch"  # "batch": retry in new batches; "online": retry online
    rounds: int = DEFAULT_ROUNDS
