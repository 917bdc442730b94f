"""ctxprec's flow and public API: the batch entry point (`score`, `run_score`), the per-row
scorer and `run_evals`, the configuration, the metric and the exception tree.

Everything loads eagerly: nothing below `pipeline` imports it any more, so the PEP 562 lazy
loader this module once had bought nothing but start-up time for `import pipeline` alone
(0.09 s instead of about 1 s), which no caller does without then using the flow.
"""

from __future__ import annotations

from pipeline.compare import compare_outputs
from pipeline.config import Config, load_config
from pipeline.driver import RunResult
from pipeline.flow import run_score, score
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
