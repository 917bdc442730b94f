"""Evals as tests: `assert_evals(result)` fails a test with the verdict in words when an
evaluation did not pass (as DeepEval's `assert_test` and Mastra's `expectEvals(...).toPass()`),
for `run_evals`' result and `score_frame`'s alike. Plain `assert` semantics: pytest shows the
message, with no frame of ctxprec's in the traceback; pytest is not needed to import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxprec.analysis.verdict import EvalVerdict

__all__ = ["EvalsFailed", "assert_evals"]


class EvalsFailed(AssertionError):
    """An evaluation's verdict failed; the message is the verdict: each reason, then the
    thresholds that were met, and the completed / skipped / error counts."""

    def __init__(self, verdict: EvalVerdict):
        super().__init__(str(verdict))
        self.verdict = verdict


def _verdict_of(result: Any) -> EvalVerdict:
    if isinstance(result, EvalVerdict):
        return result
    found = getattr(result, "verdict", None)
    if not isinstance(found, EvalVerdict):
        raise TypeError(
            "assert_evals takes what run_evals or score_frame returns (or a verdict), got "
            f"{type(result).__name__}"
        )
    return found


def assert_evals(
    result: Any, *, thresholds: float | Mapping[str, float] | None = None
) -> EvalVerdict:
    """Raise `EvalsFailed` (an AssertionError) unless the verdict of `result` passed; returns
    the verdict. `thresholds` (a number for every scorer, or {scorer id: number}) are judged
    over those the run was given, by the rule of --fail-under: each scorer's mean over the items
    it scored. An item that failed to run fails it too; not-scorable items are left out."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    verdict = _verdict_of(result)
    if thresholds is not None:
        verdict = verdict.with_thresholds(thresholds)
    if not verdict.passed:
        raise EvalsFailed(verdict)
    return verdict
