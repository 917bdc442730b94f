"""ctxprec: the flow and the public API — the batch entry point (`score`, `run_score`), the
per-row scorer and `run_evals`, the configuration, the metric and the exception tree.

This package is the repository's `pipeline/` folder; `connectors/` and `storage/` are its
sub-packages `ctxprec.connectors` and `ctxprec.storage` (pyproject.toml's package-dir).

The names load on first use (PEP 562): `ctxprec --version` and `--help` import this package on
their way to `ctxprec.cli.main` and must not pay for Polars, aiohttp and the judges (about 1 s).
`_EXPORTS` is checked like an import by tests/test_layers.py.
"""

from __future__ import annotations

# The console script imports this package before the first line of `ctxprec.__main__`, which
# holds the stop signals: until then a Ctrl-C is a traceback, so this module imports nothing
# at all (not even `typing`: its 4 ms were most of that window)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ctxprec.analysis.compare import compare_outputs
    from ctxprec.analysis.verdict import EvalVerdict
    from ctxprec.config import Config, load_config
    from ctxprec.engines.choice import score
    from ctxprec.engines.local import run_score
    from ctxprec.evals import EvalItem, EvalResult, run_evals
    from ctxprec.frames import FrameSummary, ScoredFrame, score_frame, score_frame_async
    from ctxprec.run.driver import RunOptions, RunResult
    from ctxprec.scorer import (
        ContextPrecisionScorer,
        NotScorable,
        ScoreResult,
        create_context_precision_scorer,
        not_scorable,
    )
    from ctxprec.storage.core.errors import (
        ConfigError,
        CtxprecError,
        InputError,
        JudgeError,
        JudgeRefusedRunError,
        JudgeUnreachableError,
        OutputError,
        ScoreFailedError,
        UserError,
    )
    from ctxprec.storage.core.metric import map_score, map_stage, rank_metrics, round_half_up

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "compare_outputs": "ctxprec.analysis.compare",
    "Config": "ctxprec.config",
    "load_config": "ctxprec.config",
    "RunOptions": "ctxprec.run.driver",
    "RunResult": "ctxprec.run.driver",
    "run_score": "ctxprec.engines.local",
    "FrameSummary": "ctxprec.frames",
    "ScoredFrame": "ctxprec.frames",
    "score_frame": "ctxprec.frames",
    "score_frame_async": "ctxprec.frames",
    "score": "ctxprec.engines.choice",
    "ContextPrecisionScorer": "ctxprec.scorer",
    "EvalItem": "ctxprec.evals",
    "EvalResult": "ctxprec.evals",
    "ScoreResult": "ctxprec.scorer",
    "NotScorable": "ctxprec.scorer",
    "create_context_precision_scorer": "ctxprec.scorer",
    "not_scorable": "ctxprec.scorer",
    "run_evals": "ctxprec.evals",
    "EvalVerdict": "ctxprec.analysis.verdict",
    "ConfigError": "ctxprec.storage.core.errors",
    "CtxprecError": "ctxprec.storage.core.errors",
    "InputError": "ctxprec.storage.core.errors",
    "JudgeError": "ctxprec.storage.core.errors",
    "JudgeRefusedRunError": "ctxprec.storage.core.errors",
    "JudgeUnreachableError": "ctxprec.storage.core.errors",
    "OutputError": "ctxprec.storage.core.errors",
    "ScoreFailedError": "ctxprec.storage.core.errors",
    "UserError": "ctxprec.storage.core.errors",
    "map_score": "ctxprec.storage.core.metric",
    "map_stage": "ctxprec.storage.core.metric",
    "rank_metrics": "ctxprec.storage.core.metric",
    "round_half_up": "ctxprec.storage.core.metric",
}

__all__ = [
    "Config",
    "ConfigError",
    "ContextPrecisionScorer",
    "CtxprecError",
    "EvalItem",
    "EvalResult",
    "EvalVerdict",
    "FrameSummary",
    "InputError",
    "JudgeError",
    "JudgeRefusedRunError",
    "JudgeUnreachableError",
    "NotScorable",
    "OutputError",
    "RunOptions",
    "RunResult",
    "ScoreFailedError",
    "ScoreResult",
    "ScoredFrame",
    "UserError",
    "compare_outputs",
    "create_context_precision_scorer",
    "load_config",
    "map_score",
    "map_stage",
    "not_scorable",
    "rank_metrics",
    "round_half_up",
    "run_evals",
    "run_score",
    "score",
    "score_frame",
    "score_frame_async",
]


def __getattr__(name: str) -> Any:
    import importlib  # the standard library's: not before a name is asked for (see above)

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxprec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
