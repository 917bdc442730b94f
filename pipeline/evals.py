"""`run_evals`: a dataset through the user's target, each item's retrieved context scored by
the scorers of `ctxprec.scorer`, as Mastra's runEvals: thresholds and a verdict
(`ctxprec.analysis.verdict`), outcomes (completed, skipped as not scorable, error) apart from the
scores, the corrected estimate against the items' labels. A target or callback may be a plain
function or a coroutine function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxprec.analysis.verdict import OUTCOMES, EvalVerdict, decide, thresholds_of
from ctxprec.limits.pool import each
from ctxprec.scorer import (
    EVAL_KEYS,
    STATUS_NOT_SCORABLE,
    ContextPrecisionScorer,
    NotScorable,
    ScoreResult,
    call_user,
    one_of,
    shown,
    snake_to_camel,
)
from ctxprec.spelling import camel_case_keywords, snake_keys
from ctxprec.storage.core.errors import ConfigError, JudgeError
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.core.settings import LimitsSettings
from ctxprec.storage.stats.ppi import estimate_block, ppi_fit

__all__ = ["EvalItem", "EvalResult", "run_evals"]

_LIMITS = LimitsSettings()


@dataclass
class EvalItem:
    """One data item of run_evals: what the target returned (`target_result`), each scorer's
    result, and what kept a scorer from a result: `errors` (target, scorer or callback: the
    item failed to run) and `skipped` (nothing to judge: `not_scorable`, by scorer or target)."""

    index: int
    input: Any
    output: Any = None
    ground_truth: Any = None
    # human labels of the context items, in order (a data item's "labels"): the reference of
    # the corrected estimate; None on items without labels
    labels: list[bool] | None = None
    target_result: Any = None
    scorer_results: dict[str, ScoreResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    @property
    def outcome(self) -> str:
        """ "error" (something failed), "skipped" (no scorer had anything to judge) or
        "completed"."""
        if self.errors:
            return "error"
        scored = any(r.status != STATUS_NOT_SCORABLE for r in self.scorer_results.values())
        return "completed" if scored else "skipped"


@dataclass
class EvalResult:
    """`scores`: each scorer's mean over the items it scored (rounded as every figure shown;
    None when it scored none); `verdict`: the thresholds and outcomes judged
    (`ctxprec.analysis.verdict`); `outcomes`: completed / skipped / error counts."""

    scores: dict[str, float | None]
    items: list[EvalItem]
    # per scorer, the corrected estimate of its mean against the items' labels (prediction-
    # powered, as summary.json's `estimate`); None for a scorer without a labelled item
    estimates: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    verdict: EvalVerdict = field(default_factory=lambda: EvalVerdict("passed"))

    @property
    def failed(self) -> list[EvalItem]:
        return [i for i in self.items if i.failed]

    @property
    def skipped(self) -> list[EvalItem]:
        return [i for i in self.items if i.outcome == "skipped"]

    @property
    def outcomes(self) -> dict[str, int]:
        return dict(self.verdict.outcomes)


Target = Callable[[Any], Any]  # input -> output, (output, context) or {"output", "context"}


def _split_target_output(value: Any, where: str) -> tuple[Any, Any]:
    """target(input) may return (output, context), {"output":..., "context":[...]} or output."""
    if isinstance(value, tuple) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, Mapping):
        got = snake_keys(value, where)
        if "output" in got:
            return got["output"], got.get("context", got.get("retrieved_context"))
    return value, None


async def _eval_one(
    item: EvalItem, scorers: Sequence[ContextPrecisionScorer], target: Target | None
) -> None:
    context: Any = None
    where = f"the target's return for data[{item.index}]"
    if target is not None:
        try:
            item.target_result = await call_user(target, item.input)
        except Exception as exc:  # the user's target: its failure is this item's failure
            item.errors["target"] = f"{type(exc).__name__}: {exc}"
            return
        if isinstance(item.target_result, NotScorable):
            context = item.target_result
        else:
            item.output, context = _split_target_output(item.target_result, where)
    for scorer in scorers:
        try:
            result = await scorer.score(item.input, item.output, item.ground_truth, context, where)
        except JudgeError as exc:
            item.errors[scorer.id] = str(exc)
            continue
        item.scorer_results[scorer.id] = result
        if result.status == STATUS_NOT_SCORABLE:
            item.skipped[scorer.id] = result.reason


async def _notify(callback: Callable[[EvalItem], Any] | None, item: EvalItem) -> None:
    """Call the user's callback; its failure is recorded on the item, never fatal to the run."""
    if callback is None:
        return
    try:
        await call_user(callback, item)
    except Exception as exc:
        item.errors["on_item_complete"] = f"{type(exc).__name__}: {exc}"


def _eval_data(d: Any) -> dict[str, Any]:
    """One of run_evals' data items, as runEvals takes them; TypeError naming the keys else."""
    given = snake_keys(d, "a data item") if isinstance(d, Mapping) else None
    if given is None or "input" not in given or any(k not in EVAL_KEYS for k in given):
        got = shown(d) if isinstance(d, Mapping) else type(d).__name__
        raise TypeError(
            f"run_evals: each data item is a mapping with 'input' (and optionally "
            f"{', '.join(map(snake_to_camel, EVAL_KEYS[1:]))}); got {got}"
        )
    return given


def _scorers_of(given: Sequence[Any]) -> tuple[list[ContextPrecisionScorer], dict[str, float]]:
    """The scorers, and the thresholds given with them as Mastra writes them: a scorer, or
    {"scorer": scorer, "threshold": 0.7}."""
    scorers: list[ContextPrecisionScorer] = []
    thresholds: dict[str, float] = {}
    for entry in given:
        if isinstance(entry, Mapping):
            spec = snake_keys(entry, "a scorers entry")
            if set(spec) - {"scorer", "threshold"} or "scorer" not in spec:
                raise ConfigError(
                    "run_evals: a scorers entry is a scorer or {'scorer': scorer, 'threshold': "
                    f"number}}, got {shown(entry)}"
                )
            entry, threshold = spec["scorer"], spec.get("threshold")
            if threshold is not None and isinstance(entry, ContextPrecisionScorer):
                thresholds.update(thresholds_of({entry.id: threshold}, [entry.id]))
        if not isinstance(entry, ContextPrecisionScorer):
            raise ConfigError(
                "run_evals: scorers holds what create_context_precision_scorer returns, got "
                f"{shown(entry)}"
            )
        if any(s.id == entry.id for s in scorers):
            raise ConfigError(
                f"run_evals: two scorers have the id {entry.id!r}; give each its own with "
                "options={'id': ...}"
            )
        scorers.append(entry)
    return scorers, thresholds


@camel_case_keywords
async def run_evals(
    data: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    scorers: Sequence[Any] | None = None,
    target: Target | None = None,
    on_item_complete: Callable[[EvalItem], Any] | None = None,
    concurrency: int = _LIMITS.concurrency,
    thresholds: float | Mapping[str, float] | None = None,
) -> EvalResult:
    """Run `target` on each item's input, score its retrieved context with every scorer.

    Relevance is judged against the item's ground_truth when given, else the target's output.
    One failing item is reported as failed and does not stop the others; an item with nothing
    to judge (`not_scorable`) is skipped. `concurrency` items are evaluated at once (default:
    [limits] concurrency, as the CLI's calls in flight). `thresholds` (a number for every
    scorer, or {scorer id: number}; or Mastra's {"scorer": s, "threshold": x} in `scorers`) are
    judged on each scorer's mean by the rule of --fail-under, in `result.verdict`. Mastra's one
    object, `run_evals({"data": ..., "scorers": ..., "target": ...})`, is taken too.
    """
    if isinstance(data, Mapping):
        if scorers is not None:
            raise TypeError("run_evals takes data=[...] or Mastra's one object, not both")
        spec = snake_keys(data, "run_evals' argument")
        return await run_evals(**spec)  # type: ignore[no-any-return]
    if scorers is None:
        raise TypeError("run_evals() needs scorers=[...]")
    chosen, given = _scorers_of(scorers)
    ids = [s.id for s in chosen]
    limits = {**given, **thresholds_of(thresholds, ids)}
    items = [
        EvalItem(i, d.get("input"), ground_truth=d.get("ground_truth"), labels=_labels_of(d))
        for i, d in enumerate(map(_eval_data, data))
    ]

    async def evaluate(item: EvalItem) -> None:
        await _eval_one(item, chosen, target)
        await _notify(on_item_complete, item)

    try:
        await each(items, evaluate, concurrency)
    except BaseExceptionGroup as group:  # an error inside the pool comes out as itself
        raise one_of(group) from None
    means: dict[str, tuple[float | None, int]] = {}
    for scorer in chosen:
        vals = [
            r.score
            for i in items
            if (r := i.scorer_results.get(scorer.id)) is not None and r.score is not None
        ]
        means[scorer.id] = (sum(vals) / len(vals) if vals else None, len(vals))
    scores = {s: None if m is None else round_figure(m) for s, (m, _) in means.items()}
    estimates = {s.id: _labels_estimate(items, s) for s in chosen}
    outcomes = {k: sum(i.outcome == k for i in items) for k in OUTCOMES}
    errors = [
        f"data[{i.index}] ({where}): {message}"
        for i in items
        for where, message in list(i.errors.items())[:1]
    ]
    return EvalResult(scores, items, estimates, decide(means, limits, outcomes, errors))


def _labels_of(d: Mapping[str, Any]) -> list[bool] | None:
    labels = d.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, Sequence) or not all(isinstance(x, bool) for x in labels):
        raise TypeError(
            f"run_evals: 'labels' is a list of bools, one per context item; got {labels!r}"
        )
    return list(labels)


def _labels_estimate(
    items: Sequence[EvalItem], scorer: ContextPrecisionScorer
) -> dict[str, Any] | None:
    """The scorer's mean corrected against the labels of the items that carry them (same
    metric and scale), over every item it scored; labels whose count is not the item's
    verdict count are left out (and said in `item.errors`)."""
    judge, reference = [], []
    for item in items:
        result = item.scorer_results.get(scorer.id)
        if result is None or result.score is None:
            continue
        judge.append(result.score)
        labels = item.labels
        if labels is not None and len(labels) != len(result.verdicts):
            item.errors["labels"] = (
                f"{len(labels)} labels for {len(result.verdicts)} context items: left out of "
                "the corrected estimate"
            )
            labels = None
        reference.append(float("nan") if labels is None else map_score(labels, scorer.scale))
    if not any(r == r for r in reference):  # no labelled item (NaN != NaN)
        return None
    bounds = (0.0, scorer.scale if scorer.scale > 0 else 1.0)
    return estimate_block(ppi_fit(np.asarray(judge), np.asarray(reference)), "labels", bounds)
