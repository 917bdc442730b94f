"""ctxprec's flow and public API: the per-row scorer, run_evals, and the batch entry point.

The heavier names load on first use (PEP 562), so that `connectors` can import
`pipeline.errors` without pulling in the whole flow (and without an import cycle).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError, CtxprecError, InputError, JudgeError, OutputError

if TYPE_CHECKING:
    from pipeline.config import Config, load_config
    from pipeline.flow import RunResult, run_score, score
    from pipeline.metric import map_score, map_stage, rank_metrics, round_half_up
    from pipeline.scorer import (
        ContextPrecisionScorer,
        EvalItem,
        EvalResult,
        ScoreFailedError,
        ScoreResult,
        create_context_precision_scorer,
        run_evals,
    )

_LAZY = {
    "Config": "pipeline.config",
    "load_config": "pipeline.config",
    "RunResult": "pipeline.flow",
    "run_score": "pipeline.flow",
    "score": "pipeline.flow",
    "map_score": "pipeline.metric",
    "map_stage": "pipeline.metric",
    "rank_metrics": "pipeline.metric",
    "round_half_up": "pipeline.metric",
    "ContextPrecisionScorer": "pipeline.scorer",
    "EvalItem": "pipeline.scorer",
    "EvalResult": "pipeline.scorer",
    "ScoreFailedError": "pipeline.scorer",
    "ScoreResult": "pipeline.scorer",
    "create_context_precision_scorer": "pipeline.scorer",
    "run_evals": "pipeline.scorer",
}

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
    "RunResult",
    "ScoreFailedError",
    "ScoreResult",
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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
