"""The per-row API: `create_context_precision_scorer(...)` and its `.run()` (`run_evals` over
a dataset is `ctxprec.evals`). Same judges, memo and formula as the batch pipeline. Names follow
`ctxprec.spelling` (camelCase as aliases); an extractor may be a plain function or a coroutine
function.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ctxprec.config import Config, with_settings
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
from ctxprec.spelling import camel_case_keywords, snake_keys
from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_OK
from ctxprec.storage.core.errors import (
    ConfigError,
    JudgeError,
    ScoreFailedError,
    first_meaningful,
)
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.core.settings import named_as_options
from ctxprec.storage.memo.store import Memo, judge_prefix, memo_key

__all__ = [
    "EVAL_KEYS",
    "STATUS_NOT_SCORABLE",
    "ContextPrecisionScorer",
    "NotScorable",
    "ScoreResult",
    "call_user",
    "create_context_precision_scorer",
    "not_scorable",
    "one_of",
    "shown",
    "snake_to_camel",
]

STATUS_NOT_SCORABLE = "not_scorable"  # a ScoreResult's status when there was nothing to judge


@dataclass(frozen=True, slots=True)
class NotScorable:
    """What a context extractor or a target returns for an input there is nothing to judge
    for (Mastra's `notScorable()`): the item is skipped, left out of means and thresholds and
    counted apart, with `reason`."""

    reason: str = ""


def not_scorable(reason: str = "") -> NotScorable:
    """Return this from a context extractor or a target (or as the target's context) to say
    the item has nothing to judge: `not_scorable("no retrieval for small talk")`."""
    return NotScorable(str(reason))


ContextExtractor = Callable[[Any, Any], Any]  # -> list[str] | NotScorable, or an awaitable


@dataclass(frozen=True)
class ScoreResult:
    """One scored input. `status` is "ok", "empty_context" (no item: score 0.0, no call) or
    "not_scorable" (score None). Tokens: `paid_*` are what this call paid the provider (0 for a
    verdict from the memo), `verdict_*` what the verdicts cost when they were first paid."""

    score: float | None
    reason: str
    verdicts: list[Verdict]
    prompt_version: str
    paid_input_tokens: int = 0
    paid_output_tokens: int = 0
    verdict_input_tokens: int = 0
    verdict_output_tokens: int = 0
    status: str = STATUS_OK

    @property
    def input_tokens(self) -> int:
        """The input tokens this call paid (`paid_input_tokens`)."""
        return self.paid_input_tokens

    @property
    def output_tokens(self) -> int:
        """The output tokens this call paid (`paid_output_tokens`)."""
        return self.paid_output_tokens


# the keys of the run object Mastra's scorers take (`scorer.run({input, output, ...})`), and of
# what run_evals' data items hold, in snake_case (camelCase is taken too: ctxprec.spelling)
RUN_KEYS = ("input", "output", "ground_truth", "run_id", "request_context", "runtime_context",
            "additional_context", "tracing_context")  # fmt: skip
EVAL_KEYS = ("input", "ground_truth", "request_context", "runtime_context", "tracing_context",
             "labels")  # fmt: skip
_SHAPES = (
    "a string, a message {'role': ..., 'content': ...}, a list of messages, or Mastra's agent "
    "input {'inputMessages': [...]}"
)
_LIST = "a list of strings (one per context item, in ranked order)"


def snake_to_camel(name: str) -> str:
    """`ground_truth` -> `groundTruth`: a key as Mastra's docs write it."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


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
    raise TypeError(f"scorer.run: {what} must be {_SHAPES}, got {shown(value)}")


def _is_run_object(value: Mapping[str, Any]) -> bool:
    """A mapping passed alone is Mastra's run object unless it is a message or agent input."""
    return not any(k in value for k in ("inputMessages", "messages", "content", "text", "role"))


def shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a mapping with keys {sorted(map(str, value))}"
    return type(value).__name__


def _run_object(run: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(input, output, expected output) of Mastra's run object: the expected output is its
    groundTruth when given, else its output (a context_extractor gets input and output)."""
    given = snake_keys(run, "scorer.run's run object")
    unknown = sorted(str(k) for k, s in zip(run, given, strict=True) if s not in RUN_KEYS)
    if unknown or "input" not in given:
        keys = ", ".join(map(snake_to_camel, RUN_KEYS))
        raise TypeError(
            "scorer.run takes input=..., output=... or Mastra's run object {'input': ..., "
            f"'output': ..., 'groundTruth': ...}} (keys: {keys}); got "
            + (f"unknown key(s) {', '.join(unknown)}" if unknown else "no 'input' key")
        )
    truth = given.get("ground_truth")
    return given["input"], given.get("output"), truth if truth is not None else given.get("output")


def _checked_context(value: Any, source: str) -> list[str] | NotScorable:
    """The context items as given by `source` (an option, a call, an extractor or a target),
    or a ConfigError naming it: a string is not a list of items (it would be judged character by
    character), and every item is a string."""
    if isinstance(value, NotScorable):
        return value
    if isinstance(value, str | bytes):
        raise ConfigError(
            f"{source} is a string; give {_LIST}, or ctxprec.not_scorable(reason) when there is "
            "nothing to judge"
        )
    if value is None or isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise ConfigError(f"{source} must be {_LIST}, got {shown(value)}")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError(
                f"{source}: item #{i + 1} is {type(item).__name__}, not a string; give {_LIST}"
            )
    return items


async def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """The user's function called as it is written: a coroutine function (or one returning an
    awaitable) awaited, a plain function's value taken as it is."""
    value = fn(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


def one_of(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to raise for a task group's: a Ctrl-C or a user error first, else the group's
    only exception, else the group."""
    found = first_meaningful(group)
    return group.exceptions[0] if found is group and len(group.exceptions) == 1 else found


# one context item's verdict: (relevant, reason, input tokens, output tokens, paid by this call)
_Reply = tuple[bool, str, int, int, bool]


class ContextPrecisionScorer:
    """Scores one (input, output, context) at a time; items are judged concurrently."""

    def __init__(
        self,
        judge: Judge,
        *,
        context: Sequence[str] | NotScorable | None,
        extractor: ContextExtractor | None,
        scale: float,
        reason: str,
        memo: Memo | None,
        stats: JudgeStats,
        verdict_only: bool = False,
        id: str = "context-precision",
    ):
        self.id = id
        self.judge = judge
        self.context = None if context is None else _checked_context(context, "option 'context'")
        self.extractor = extractor
        self.scale = scale
        self.reason_mode = reason
        self.memo = memo
        self.stats = stats
        self.verdict_only = verdict_only
        self._prefix = judge_prefix(judge.identity())

    async def _context_for(
        self, input: Any, output: Any, context: Any, source: str
    ) -> list[str] | NotScorable:
        if context is not None:
            return _checked_context(context, source)
        if self.extractor is not None:
            got = await call_user(self.extractor, input, output)
            return _checked_context(got, "the context_extractor's return")
        if self.context is not None:
            return self.context
        raise ConfigError("no context: pass options={'context': [...]} or a context_extractor")

    @camel_case_keywords
    async def run(
        self,
        input: Any = None,
        output: Any = None,
        *,
        context: Sequence[str] | NotScorable | None = None,
        ground_truth: Any = None,
    ) -> ScoreResult:
        """Judge every item, then score. `output` is the expected output unless `ground_truth`
        is given (None: query only). `scorer.run({"input": ..., "output": ..., "groundTruth":
        ...})`, Mastra's run object, is read as Mastra's scorers read it (see `_run_object`).
        `context` (or what run_evals' target returned) wins over the context_extractor and
        options["context"]."""
        if isinstance(input, Mapping) and output is None and _is_run_object(input):
            input, output, ground_truth = _run_object(input)
        return await self.score(input, output, ground_truth, context, "scorer.run(context=...)")

    async def score(
        self, input: Any, output: Any, ground_truth: Any, context: Any, source: str
    ) -> ScoreResult:
        """`run` with the context's `source` named in its errors (run_evals: the target)."""
        query = _text(input, "input", "user") or ""
        expected = _text(
            ground_truth if ground_truth is not None else output, "output", "assistant"
        )
        items = await self._context_for(input, output, context, source)
        version = prompt_version_for(expected, False, self.verdict_only)
        if isinstance(items, NotScorable):
            why = f"not scorable: {items.reason}" if items.reason else "not scorable"
            return ScoreResult(None, why, [], version, status=STATUS_NOT_SCORABLE)
        replies: list[_Reply | None] = [None] * len(items)
        errors: list[str] = []
        try:
            with named_as_options():  # a judge's refusal names options, not flags
                async with anyio.create_task_group() as tg:
                    for i, item in enumerate(items):
                        request = ItemRequest(query, expected, item)
                        tg.start_soon(self._judge_one, i, request, version, replies, errors)
        except BaseExceptionGroup as group:  # the run refused (a bad key, no such model)
            raise one_of(group) from None
        if errors:
            partial = [Verdict(r[0], r[1]) if r else None for r in replies]
            raise ScoreFailedError(
                f"{len(errors)} of {len(items)} items failed: {errors[0]}", partial
            )
        got = [r for r in replies if r is not None]
        return await self._result(query, expected, got, version)

    async def _judge_one(
        self,
        i: int,
        req: ItemRequest,
        version: str,
        out: list[_Reply | None],
        errors: list[str],
    ) -> None:
        key = memo_key(self._prefix, version, req.query, req.expected, req.item)
        if self.memo is not None:
            hit = await anyio.to_thread.run_sync(self.memo.get_many, [key])
            if key in hit:
                out[i] = (*hit[key], False)  # its tokens were paid when it was first judged
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
        out[i] = (*entry, True)
        if self.memo is not None:
            await anyio.to_thread.run_sync(self.memo.set_many, [(key, entry)])

    async def _result(
        self, query: str, expected: str | None, got: list[_Reply], version: str
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
            paid_input_tokens=sum(g[2] for g in got if g[4]),
            paid_output_tokens=sum(g[3] for g in got if g[4]),
            verdict_input_tokens=sum(g[2] for g in got),
            verdict_output_tokens=sum(g[3] for g in got),
            status=STATUS_OK if got else STATUS_EMPTY,
        )

    async def aclose(self) -> None:
        await self.judge.aclose()
        if self.memo is not None:
            self.memo.close()


# the API's defaults are the CLI's: the fields of storage/core/settings.py
_JUDGE = JudgeSettings()
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
# the scorer's own options, beside the settings
_OWN = ("context", "context_extractor", "id")


def _api_settings(model: str, opts: Mapping[str, Any]) -> Config:
    """The settings the options give, checked as the CLI checks its flags (the loader's types and
    rules, the same ConfigError messages naming the option); the environment is not read. A
    judge call with its retries ends within `timeout_s` unless `retry_budget_s` is given (the
    CLI waits out a judge that is down for its whole budget; a caller in code wants an
    answer)."""
    unknown = set(opts) - set(_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown option(s): {', '.join(sorted(unknown))}; the options: "
            f"{', '.join((*_OWN, *_OPTIONS))} (or their camelCase spellings)"
        )
    flags: dict[str, Any] = {"judge.model": model}
    for name, value in opts.items():
        flags[_OPTIONS[name]] = str(value) if isinstance(value, Path) else value
    providers = flags.pop("judge.providers", None)  # already a table, as the loader makes it
    cfg = with_settings(Config(), flags)
    if providers is not None:
        cfg = dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, providers=providers))
    if "retry_budget_s" not in opts:
        judge = dataclasses.replace(cfg.judge, retry_budget_s=cfg.judge.timeout_s)
        cfg = dataclasses.replace(cfg, judge=judge)
    return cfg


def create_context_precision_scorer(
    model: str | Mapping[str, Any] = _JUDGE.model, options: Mapping[str, Any] | None = None
) -> ContextPrecisionScorer:
    """options: context (a list of strings), context_extractor (`fn(input, output)`, plain or
    async, returning a list of strings or `not_scorable(reason)`; wins over context), scale,
    reason ("verdicts" | "llm"), base_url, api_key_env, concurrency, rpm, tpm, timeout_s (a
    judge call with its retries ends within it), max_retries, temperature, verdict_only (any
    [judge] setting but mode and batch_api), cache_dir (memo on disk; none by default), id (the
    scorer's id in run_evals' results). Each may be written in camelCase (`contextExtractor`).
    Defaults are those of the CLI (storage/core/settings.py): concurrency 32, scale 1, ...
    Mastra's one object, `create_context_precision_scorer({"model": ..., "options": {...}})`,
    is taken too."""
    if isinstance(model, Mapping):
        model, options = _mastra_call(model, options)
    opts = snake_keys(options or {}, "options")
    context = opts.pop("context", None)
    extractor = opts.pop("context_extractor", None)
    scorer_id = opts.pop("id", "context-precision")
    if context is None and extractor is None:
        raise ConfigError(
            "create_context_precision_scorer needs options={'context': [...]} or "
            "options={'context_extractor': fn}"
        )
    if extractor is not None and not callable(extractor):
        raise ConfigError(
            f"option 'context_extractor' must be a function (input, output) -> list of "
            f"strings, got {shown(extractor)}"
        )
    if not isinstance(scorer_id, str) or not scorer_id:
        raise ConfigError(f"option 'id' must be a non-empty string, got {scorer_id!r}")
    if context is not None:
        _checked_context(context, "option 'context'")  # before a judge is made
    cfg = _api_settings(model, opts)
    limits, stats = cfg.limits, JudgeStats()
    throttle = RateThrottle(limits.concurrency, limits.rpm, limits.tpm, adaptive=limits.adaptive)
    with named_as_options():
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
        id=scorer_id,
    )


def _mastra_call(
    given: Mapping[str, Any], options: Mapping[str, Any] | None
) -> tuple[str, Mapping[str, Any] | None]:
    """(model, options) of Mastra's `createContextPrecisionScorer({model, options})`."""
    spec = snake_keys(given, "create_context_precision_scorer's argument")
    if options is not None or set(spec) - {"model", "options"}:
        raise TypeError(
            "create_context_precision_scorer takes model=..., options={...} or Mastra's one "
            f"object {{'model': ..., 'options': {{...}}}}; got {shown(given)}"
        )
    model = spec.get("model", _JUDGE.model)
    if not isinstance(model, str):
        raise ConfigError(f"model must be a string provider/model, got {shown(model)}")
    return model, spec.get("options")
