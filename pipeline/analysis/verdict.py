"""The verdict of an evaluation run in code (`run_evals`, `score_frame`), as Mastra's runEvals
gives one: each scorer's mean against its threshold, by the rule and statistics of
`--fail-under` (the mean of the items scored, none failed or skipped in it; `quality_gate.below`),
and the execution outcomes (completed, skipped as not scorable, error) counted apart from the
scores. A threshold missed, a threshold no item could be scored for, or an item that failed to
run fails it: failed items are never hidden behind a mean, as on the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxprec.analysis.quality_gate import below, shortfall
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.figures import counted, round_figure

__all__ = ["OUTCOMES", "EvalVerdict", "ThresholdResult", "decide", "thresholds_of"]

OUTCOMES = ("completed", "skipped", "error")  # what running an item came to, score aside
_SHOWN_ERRORS = 3


@dataclass(frozen=True, slots=True)
class ThresholdResult:
    """One scorer's mean against its threshold: `mean` rounded as every figure shown, over the
    `items` it scored."""

    scorer: str
    threshold: float
    mean: float | None
    items: int
    passed: bool
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True, eq=False)
class EvalVerdict:
    """`status` "passed" or "failed", the `reasons` it failed for (empty when it passed), each
    threshold's result and the execution outcomes (completed / skipped / error counts). It
    equals its status, as Mastra's verdict is one (`evals.verdict == "passed"`); `str()` is
    the verdict in words."""

    status: str
    reasons: tuple[str, ...] = ()
    thresholds: tuple[ThresholdResult, ...] = ()
    outcomes: Mapping[str, int] = field(default_factory=dict)
    # what it was decided from: each scorer's unrounded (mean, items scored), the errors shown
    scored: Mapping[str, tuple[float | None, int]] = field(default_factory=dict, repr=False)
    errors: tuple[str, ...] = field(default=(), repr=False)
    noun: str = field(default="item", repr=False)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.status == other
        if isinstance(other, EvalVerdict):
            mine = (self.status, self.reasons, self.thresholds, dict(self.outcomes))
            return mine == (other.status, other.reasons, other.thresholds, dict(other.outcomes))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.status, self.reasons))

    def with_thresholds(self, given: float | Mapping[str, Any] | None) -> EvalVerdict:
        """The verdict again with `given` thresholds over the ones it had."""
        limits = {t.scorer: t.threshold for t in self.thresholds}
        limits.update(thresholds_of(given, list(self.scored)))
        return decide(self.scored, limits, self.outcomes, self.errors, self.noun)

    def __str__(self) -> str:
        counts = ", ".join(f"{self.outcomes.get(k, 0)} {k}" for k in OUTCOMES)
        lines = [f"verdict: {self.status} ({counts})"]
        lines += [f"  - {reason}" for reason in self.reasons]
        lines += [f"  ok: {t.message}" for t in self.thresholds if t.passed]
        return "\n".join(lines)


def thresholds_of(
    given: float | Mapping[str, Any] | None, scorers: Sequence[str]
) -> dict[str, float]:
    """{scorer id: threshold} from a number (every scorer) or a mapping by scorer id; a
    ConfigError naming an unknown scorer or a value that is not a number."""
    if given is None:
        return {}
    if isinstance(given, bool) or not isinstance(given, int | float | Mapping):
        raise ConfigError(
            f"thresholds must be a number or a mapping of scorer id to number, got {given!r}"
        )
    pairs = dict.fromkeys(scorers, given) if not isinstance(given, Mapping) else dict(given)
    out: dict[str, float] = {}
    for scorer, value in pairs.items():
        if scorer not in scorers:
            raise ConfigError(
                f"thresholds: no scorer {scorer!r} in this run (its scorers: {', '.join(scorers)})"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ConfigError(f"thresholds: {scorer!r} must be a number, got {value!r}")
        out[scorer] = float(value)
    return out


def _threshold(
    scorer: str, threshold: float, mean: float | None, n: int, noun: str
) -> ThresholdResult:
    if mean is None:
        message = f"{scorer}: no {noun} was scored, so its threshold {threshold:g} cannot be met"
        return ThresholdResult(scorer, threshold, None, 0, False, message)
    shown = round_figure(mean)
    if below(mean, threshold):
        message = (
            f"{scorer}: the mean score of {counted(n, 'scored ' + noun)} is "
            f"{shortfall(mean, threshold)} {threshold:g}"
        )
        return ThresholdResult(scorer, threshold, shown, n, False, message)
    message = f"{scorer}: mean {shown:.4f} over {counted(n, 'scored ' + noun)} meets {threshold:g}"
    return ThresholdResult(scorer, threshold, shown, n, True, message)


def decide(
    means: Mapping[str, tuple[float | None, int]],
    thresholds: Mapping[str, float],
    outcomes: Mapping[str, int],
    errors: Sequence[str] = (),
    noun: str = "item",
) -> EvalVerdict:
    """The verdict from each scorer's unrounded (mean, items scored), the thresholds, the
    outcome counts and the errors of the items that failed to run (the first few are named)."""
    results = tuple(
        _threshold(s, t, *means.get(s, (None, 0)), noun=noun) for s, t in thresholds.items()
    )
    reasons = [r.message for r in results if not r.passed]
    failed = outcomes.get("error", 0)
    if failed:
        total = sum(outcomes.values())
        shown = "; ".join(errors[:_SHOWN_ERRORS])
        more = f" (and {failed - _SHOWN_ERRORS} more)" if failed > _SHOWN_ERRORS else ""
        reasons.append(f"{failed} of {counted(total, noun)} failed to run: {shown}{more}")
    status = "failed" if reasons else "passed"
    return EvalVerdict(
        status, tuple(reasons), results, dict(outcomes), dict(means), tuple(errors), noun
    )
