"""The per-row API: `create_context_precision_scorer(...)` and its `.run()`, plus
`run_evals` over a list of items with a target function. Same judges, memo and formula as the
batch pipeline.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ctxprec.config import API_OPTIONS, Config, load_config
from ctxprec.connectors.judges import (
    ItemRequest,
    Judge,
    JudgeSettings,
    JudgeStats,
    Verdict,
    create_judge,
)
from ctxprec.connectors.judges.prompts import (
    CRITERION,
    CRITERION_QUERY_ONLY,
    prompt_version_for,
    reason_prompt,
)
from ctxprec.flow.llm_reason import keep_built_reason
from ctxprec.flow.reason import build_reason
from ctxprec.limits.limiter import RateThrottle
from ctxprec.limits.pool import each
from ctxprec.storage.core.errors import ConfigError, JudgeError, ScoreFailedError
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.core.settings import LimitsSettings
from ctxprec.storage.memo.store import Memo, judge_prefix, memo_key
from ctxprec.storage.stats.ppi import estimate_block, ppi_fit

__all__ = [
    "ContextPrecisionScorer",
    "EvalItem",
    "EvalResult",
    "ScoreResult",
    "create_context_precision_scorer",
    "run_evals",
]

ContextExtractor = Callable[[Any, Any], Sequence[str]]


@dataclass(frozen=True)
class ScoreResult:
    """One scored row. Tokens come twice: `paid_*`, what this call of `run` paid (its judge
    calls; a verdict from the memo pays nothing), and `verdict_*`, what the row's verdicts
    cost when they were first paid (memo hits included)."""

    score: float
    reason: str
    verdicts: list[Verdict]
    prompt_version: str
    paid_input_tokens: int = 0
    paid_output_tokens: int = 0
    verdict_input_tokens: int = 0
    verdict_output_tokens: int = 0


# the keys of the run object Mastra's scorers take (`scorer.run({input, output, ...})`)
RUN_KEYS = ("input", "output", "groundTruth", "ground_truth", "runId", "requestContext",
            "runtimeContext", "additionalContext", "tracingContext")  # fmt: skip
# what runEvals' data items hold
EVAL_KEYS = ("input", "groundTruth", "ground_truth", "requestContext", "runtimeContext",
             "tracingContext", "labels")  # fmt: skip
_SHAPES = (
    "a string, a message {'role': ..., 'content': ...}, a list of messages, or Mastra's agent "
    "input {'inputMessages': [...]}"
)


def _message_text(message: Mapping[str, Any]) -> str | None:
    """A message's text as Mastra reads it: `content` (a string, or {content} / {parts}),
    else `text`."""
    content = message.get("content")
    if isinstance(content, Mapping):
        if isinstance(content.get("content"), str):
            return str(content["content"])
        content = content.get("parts")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # parts: the last text part, as Mastra takes it
        texts = [p["text"] for p in content if isinstance(p, Mapping) and "text" in p]
        return str(texts[-1]) if texts else ""
    text = message.get("text")
    return text if isinstance(text, str) else None


def _text(value: Any, what: str, role: str) -> str | None:
    """The text of a run's `input` (its first `role` message) or `output`, in any of Mastra's
    shapes; TypeError naming them for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and ("inputMessages" in value or "messages" in value):
        value = value.get("inputMessages") or value.get("messages") or []
    if isinstance(value, Mapping) and ("content" in value or "text" in value):
        found = _message_text(value)
        if found is not None:
            return found
    if isinstance(value, Sequence) and all(isinstance(m, Mapping) for m in value):
        mine = [m for m in value if m.get("role") == role] or list(value)
        return (_message_text(mine[0]) or "") if mine else ""
    raise TypeError(f"scorer.run: {what} must be {_SHAPES}, got {_shown(value)}")


def _is_run_object(value: Mapping[str, Any]) -> bool:
    """A mapping passed alone is Mastra's run object unless it is a message or agent input."""
    return not any(k in value for k in ("inputMessages", "messages", "content", "text", "role"))


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a mapping with keys {sorted(map(str, value))}"
    return type(value).__name__


def _run_object(run: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(input, output, expected output) of Mastra's run object: the expected output is its
    groundTruth when given, else its output (a context_extractor gets input and output)."""
    unknown = sorted(str(k) for k in run if k not in RUN_KEYS)
    if unknown or "input" not in run:
        raise TypeError(
            "scorer.run takes input=..., output=... or Mastra's run object {'input': ..., "
            f"'output': ..., 'groundTruth': ...}} (keys: {', '.join(RUN_KEYS)}); got "
            + (f"unknown key(s) {', '.join(unknown)}" if unknown else "no 'input' key")
        )
    truth = run.get("groundTruth", run.get("ground_truth"))
    return run["input"], run.get("output"), truth if truth is not None else run.get("output")


class ContextPrecisionScorer:
    """Scores one (input, output, context) at a time; items are judged concurrently."""

    id = "context-precision"

    def __init__(
        self,
        judge: Judge,
        *,
        context: Sequence[str] | None,
        extractor: ContextExtractor | None,
        scale: float,
        reason: str,
        memo: Memo | None,
        stats: JudgeStats,
        verdict_only: bool = False,
    ):
        self.judge = judge
        self.context = list(context) if context is not None else None
        self.extractor = extractor
        self.scale = scale
        self.reason_mode = reason
        self.memo = memo
        self.stats = stats
        self.verdict_only = verdict_only
        self._prefix = judge_prefix(judge.identity())

    def _context_for(self, input: Any, output: Any, context: Sequence[str] | None) -> list[str]:
        if context is not None:
            items = context
        elif self.extractor is not None:
            items = self.extractor(input, output)
        elif self.context is not None:
            items = self.context
        else:
            raise ConfigError("no context: pass options={'context': [...]} or a context_extractor")
        bad = [i for i, t in enumerate(items) if not isinstance(t, str)]
        if bad:
            raise ConfigError(f"context item #{bad[0] + 1} is not a string")
        return list(items)

    async def run(
        self, input: Any = None, output: Any = None, *, context: Sequence[str] | None = None
    ) -> ScoreResult:
        """Judge every item, then score. `output` is the expected output (None: query only).
        `scorer.run({"input": ..., "output": ..., "groundTruth": ...})`, Mastra's run object, is
        read as Mastra's scorers read it (see `_run_object`). `context` (or what run_evals'
        target returned) wins over the context_extractor and options["context"]."""
        expected_as_given = output
        if isinstance(input, Mapping) and output is None and _is_run_object(input):
            input, output, expected_as_given = _run_object(input)
        query = _text(input, "input", "user") or ""
        expected = _text(expected_as_given, "output", "assistant")
        items = self._context_for(input, output, context)
        version = prompt_version_for(expected, False, self.verdict_only)
        replies: list[tuple[bool, str, int, int] | None] = [None] * len(items)
        errors: list[str] = []
        paid = [False] * len(items)  # judged by this call, not read from the memo
        async with anyio.create_task_group() as tg:
            for i, item in enumerate(items):
                request = ItemRequest(query, expected, item)
                tg.start_soon(self._judge_one, i, request, version, replies, errors, paid)
        if errors:
            partial = [Verdict(r[0], r[1]) if r else None for r in replies]
            raise ScoreFailedError(
                f"{len(errors)} of {len(items)} items failed: {errors[0]}", partial
            )
        got = [r for r in replies if r is not None]
        result = await self._result(query, expected, got, version)
        now = [r for r, p in zip(got, paid, strict=True) if p]
        return dataclasses.replace(
            result,
            paid_input_tokens=sum(r[2] for r in now),
            paid_output_tokens=sum(r[3] for r in now),
        )

    async def _judge_one(
        self,
        i: int,
        req: ItemRequest,
        version: str,
        out: list[tuple[bool, str, int, int] | None],
        errors: list[str],
        paid: list[bool],
    ) -> None:
        key = memo_key(self._prefix, version, req.query, req.expected, req.item)
        if self.memo is not None:
            hit = await anyio.to_thread.run_sync(self.memo.get_many, [key])
            if key in hit:
                out[i] = hit[key]
                return
        try:
            reply = await self.judge.judge_item(req)
        except JudgeError as exc:
            errors.append(f"item #{i + 1}: {exc.cause}: {exc}")
            return
        entry = (
            reply.verdict.relevant,
            reply.verdict.reason,
            reply.input_tokens,
            reply.output_tokens,
        )
        out[i] = entry
        paid[i] = True
        if self.memo is not None:
            await anyio.to_thread.run_sync(self.memo.set_many, [(key, entry)])

    async def _result(
        self, query: str, expected: str | None, got: list[tuple[bool, str, int, int]], version: str
    ) -> ScoreResult:
        relevant = [g[0] for g in got]
        score = map_score(relevant, self.scale)
        criterion = CRITERION if expected is not None else CRITERION_QUERY_ONLY
        reason = build_reason(
            relevant, [g[1] for g in got], score=score, scale=self.scale, criterion=criterion,
            verdict_only=self.verdict_only,
        )  # fmt: skip
        if self.reason_mode == "llm" and got:
            written = await self.judge.write_reason(reason_prompt(query, expected, reason, score))
            reason = keep_built_reason(written, reason)
        return ScoreResult(
            score,
            reason,
            [Verdict(g[0], g[1]) for g in got],
            version,
            verdict_input_tokens=sum(g[2] for g in got),
            verdict_output_tokens=sum(g[3] for g in got),
        )

    async def aclose(self) -> None:
        await self.judge.aclose()
        if self.memo is not None:
            self.memo.close()


# the API's defaults are the CLI's: the fields of storage/core/settings.py
_JUDGE, _LIMITS = JudgeSettings(), LimitsSettings()
# option -> setting: any [judge] setting but the row mode and batch ones (the scorer calls the
# judge item by item, online), the [limits] of the calls, the score's scale and reason, the memo
_OPTIONS = {
    **{
        name: f"judge.{name}"
        for name in JudgeSettings.__dataclass_fields__
        if name not in ("model", "mode") and not name.startswith("batch_")
    },
    **{name: f"limits.{name}" for name in ("concurrency", "rpm", "tpm")},
    "scale": "scoring.scale",
    "reason": "scoring.reason",
    "cache_dir": "run.cache_dir",
}


def _api_settings(model: str, opts: Mapping[str, Any]) -> Config:
    """The settings the options give, checked as the CLI checks its flags (the loader's types and
    rules, the same ConfigError messages naming the option); the environment is not read."""
    unknown = set(opts) - set(_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
    flags: dict[str, Any] = {"judge.model": model}
    for name, value in opts.items():
        flags[_OPTIONS[name]] = str(value) if isinstance(value, Path) else value
    providers = flags.pop("judge.providers", None)  # already a table, as the loader makes it
    cfg = load_config(None, flags, env={}, flags_origin=API_OPTIONS)
    if providers is not None:
        cfg = dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, providers=providers))
    return cfg


def create_context_precision_scorer(
    model: str = _JUDGE.model, options: Mapping[str, Any] | None = None
) -> ContextPrecisionScorer:
    """options: context, context_extractor (wins over context), scale, reason ("verdicts" |
    "llm"), base_url, api_key_env, concurrency, rpm, tpm, timeout_s, max_retries, temperature,
    verdict_only (any [judge] setting but mode and batch_api), cache_dir (memo on disk; none by
    default).
    Defaults are those of the CLI (storage/core/settings.py): concurrency 32, scale 1, ..."""
    opts = dict(options or {})
    context = opts.pop("context", None)
    extractor = opts.pop("context_extractor", None) or opts.pop("contextExtractor", None)
    if context is None and extractor is None:
        raise ConfigError(
            "create_context_precision_scorer needs options={'context': [...]} or "
            "options={'context_extractor': fn}"
        )
    cfg = _api_settings(model, opts)
    limits, stats = cfg.limits, JudgeStats()
    throttle = RateThrottle(limits.concurrency, limits.rpm, limits.tpm, adaptive=limits.adaptive)
    judge = create_judge(cfg.judge, throttle=throttle, stats=stats)
    cache_dir = cfg.run.cache_dir if "cache_dir" in opts else None  # no memo unless asked
    return ContextPrecisionScorer(
        judge,
        context=context,
        extractor=extractor,
        scale=cfg.scoring.scale,
        reason=cfg.scoring.reason,
        memo=Memo(cache_dir) if cache_dir else None,
        stats=stats,
        verdict_only=cfg.judge.verdict_only,
    )


@dataclass
class EvalItem:
    index: int
    input: Any
    output: Any = None
    ground_truth: Any = None
    # human labels of the context items, in order (a data item's "labels"): the reference of
    # the corrected estimate; None on items without labels
    labels: list[bool] | None = None
    scorer_results: dict[str, ScoreResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.errors)


@dataclass
class EvalResult:
    scores: dict[str, float | None]
    items: list[EvalItem]
    # per scorer, the corrected estimate of its mean against the items' labels (prediction-
    # powered, as summary.json's `estimate`); None for a scorer without a labelled item
    estimates: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def failed(self) -> list[EvalItem]:
        return [i for i in self.items if i.failed]


Target = Callable[[Any], Awaitable[Any]]


def _split_target_output(value: Any) -> tuple[Any, Sequence[str] | None]:
    """target(input) may return (output, context), {"output":..., "context":[...]} or output."""
    if isinstance(value, tuple) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, Mapping) and "output" in value:
        ctx = value.get("context", value.get("retrieved_context"))
        return value["output"], ctx
    return value, None


async def _eval_one(
    item: EvalItem, scorers: Sequence[ContextPrecisionScorer], target: Target | None
) -> None:
    context: Sequence[str] | None = None
    if target is not None:
        try:
            item.output, context = _split_target_output(await target(item.input))
        except Exception as exc:  # the user's target: its failure is this item's failure
            item.errors["target"] = f"{type(exc).__name__}: {exc}"
            return
    expected = item.ground_truth if item.ground_truth is not None else item.output
    for scorer in scorers:
        try:
            item.scorer_results[scorer.id] = await scorer.run(item.input, expected, context=context)
        except (JudgeError, ConfigError) as exc:
            item.errors[scorer.id] = str(exc)


async def _notify(callback: Callable[[EvalItem], Any] | None, item: EvalItem) -> None:
    """Call the user's callback; its failure is recorded on the item, never fatal to the run."""
    if callback is None:
        return
    try:
        res = callback(item)
        if inspect.isawaitable(res):
            await res
    except Exception as exc:
        item.errors["on_item_complete"] = f"{type(exc).__name__}: {exc}"


def _eval_data(d: Any) -> Mapping[str, Any]:
    """One of run_evals' data items, as runEvals takes them; TypeError naming the keys else."""
    if not isinstance(d, Mapping) or "input" not in d or any(k not in EVAL_KEYS for k in d):
        got = _shown(d) if isinstance(d, Mapping) else type(d).__name__
        raise TypeError(
            f"run_evals: each data item is a mapping with 'input' (and optionally "
            f"{', '.join(EVAL_KEYS[1:])}); got {got}"
        )
    return d


async def run_evals(
    data: Sequence[Mapping[str, Any]],
    scorers: Sequence[ContextPrecisionScorer],
    target: Target | None = None,
    on_item_complete: Callable[[EvalItem], Any] | None = None,
    concurrency: int = _LIMITS.concurrency,
) -> EvalResult:
    """Run `target` on each item's input, score its retrieved context with every scorer.

    Relevance is judged against the item's ground_truth when given, else the target's output.
    One failing item is reported as failed and does not stop the others. `concurrency` items
    are evaluated at once (default: [limits] concurrency, as the CLI's calls in flight).
    """
    items = [
        EvalItem(
            i,
            d.get("input"),
            ground_truth=d.get("ground_truth", d.get("groundTruth")),
            labels=_labels_of(d),
        )
        for i, d in enumerate(map(_eval_data, data))
    ]

    async def evaluate(item: EvalItem) -> None:
        await _eval_one(item, scorers, target)
        await _notify(on_item_complete, item)

    await each(items, evaluate, concurrency)
    scores: dict[str, float | None] = {}
    for scorer in scorers:
        vals = [i.scorer_results[scorer.id].score for i in items if scorer.id in i.scorer_results]
        scores[scorer.id] = sum(vals) / len(vals) if vals else None
    estimates = {s.id: _labels_estimate(items, s) for s in scorers}
    return EvalResult(scores, items, estimates)


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
        if result is None:
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
