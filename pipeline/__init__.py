"""ctxprec's flow and public API: the batch entry point (`score`, `run_score`), the per-row
scorer and `run_evals`, the configuration, the metric and the exception tree.

The names load on first use (PEP 562): `ctxprec --version` and `--help` import this package on
their way to `pipeline.cli.main` and must not pay for Polars, aiohttp and the judges (about 1 s).
`_EXPORTS` is checked like an import by tests/test_layers.py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.analysis.compare import compare_outputs
    from pipeline.config import Config, load_config
    from pipeline.engines.choice import score
    from pipeline.engines.local import run_score
    from pipeline.run.driver import RunOptions, RunResult
    from pipeline.scorer import (
        ContextPrecisionScorer,
        EvalItem,
        EvalResult,
        ScoreResult,
        create_context_precision_scorer,
        run_evals,
    )
    from storage.core.errors import (
        ConfigError,
        CtxprecError,
        InputError,
        JudgeError,
        OutputError,
        ScoreFailedError,
        UserError,
    )
    from storage.core.metric import map_score, map_stage, rank_metrics, round_half_up

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "compare_outputs": "pipeline.analysis.compare",
    "Config": "pipeline.config",
    "load_config": "pipeline.config",
    "RunOptions": "pipeline.run.driver",
    "RunResult": "pipeline.run.driver",
    "run_score": "pipeline.engines.local",
    "score": "pipeline.engines.choice",
    "ContextPrecisionScorer": "pipeline.scorer",
    "EvalItem": "pipeline.scorer",
    "EvalResult": "pipeline.scorer",
    "ScoreResult": "pipeline.scorer",
    "create_context_precision_scorer": "pipeline.scorer",
    "run_evals": "pipeline.scorer",
    "ConfigError": "storage.core.errors",
    "CtxprecError": "storage.core.errors",
    "InputError": "storage.core.errors",
    "JudgeError": "storage.core.errors",
    "OutputError": "storage.core.errors",
    "ScoreFailedError": "storage.core.errors",
    "UserError": "storage.core.errors",
    "map_score": "storage.core.metric",
    "map_stage": "storage.core.metric",
    "rank_metrics": "storage.core.metric",
    "round_half_up": "storage.core.metric",
}

__ctxprec__ = True  # this package is ctxprec's: the console script checks it (ctxprec_entry.py)
__all__ = [
    "Config",
    "ConfigError",
    "ContextPrecisionScorer",
    "CtxprecError",
    "EvalItem",
    "EvalResult",
    "InputError",
    "JudgeError",
    "OutputError",
    "RunOptions",
    "RunResult",
    "ScoreFailedError",
    "ScoreResult",
    "UserError",
    "compare_outputs",
    "create_context_precision_scorer",
    "load_config",
    "map_score",
    "map_stage",
    "rank_metrics",
    "round_half_up",
    "run_evals",
    "run_score",
    "score",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
