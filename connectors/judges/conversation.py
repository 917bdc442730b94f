"""The judge's conversation with a model over HTTP: build the request (prompts, schema, the
run's request shape), send it (`client.HttpClient.post_json`), read the reply (the tolerant
parser), raise the completion budget when a reply was cut off, and re-ask once, showing the model
its reply, when the reply is unreadable. Providers (`openai`, `anthropic`) add the request and
reply shapes; the batch clients reuse `build_payload` and `read_response`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, TypeVar

import anyio

from ctxprec.connectors.judges import prompts
from ctxprec.connectors.judges.base import (
    ItemRequest,
    JudgeStats,
    RowItemsError,
    Throttle,
    estimate_tokens,
)
from ctxprec.connectors.judges.catalog import ProviderSpec, builtin_providers
from ctxprec.connectors.judges.client import UNKNOWN, HttpClient
from ctxprec.connectors.judges.parse import parse_row_verdicts, parse_verdict
from ctxprec.connectors.judges.secrets import redact
from ctxprec.connectors.judges.shapes import BUDGET_CAP, RequestShape
from ctxprec.storage.core.errors import (
    JudgeError,
    JudgeFatalError,
    JudgeNoVerdictError,
    JudgeParseError,
)
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.core.verdict import JudgeReply, Verdict

__all__ = ["HttpJudgeBase", "Message", "Row", "Schema"]

T = TypeVar("T")
Message = dict[str, str]
Schema = tuple[str, dict[str, object]]
Row = tuple[str, str | None, Sequence[str]]

_REASK_ITEM = 'Reply with JSON only: {"relevant": true|false, "reason": "..."}'
_REASK_ITEM_VERDICT_ONLY = 'Reply with JSON only: {"relevant": true|false}'
_REASK_ROW = (
    'Reply with JSON only: {{"verdicts": [{{"index": 0, "relevant": true|false{reason}}}, '
    "...]}} with exactly {n} verdicts, one per item (index 0 to {last}), "
    "in order: none missing, none repeated."
)
_REASK_ROW_REASON = ', "reason": "..."'

_REASON_SYSTEM = "You explain retrieval evaluation results to engineers, concisely and plainly."

# one object each: request templates key on it; by verdict-only
_ITEM: dict[bool, Schema] = {
    False: ("verdict", prompts.ITEM_SCHEMA),
    True: ("verdict", prompts.ITEM_SCHEMA_VERDICT_ONLY),
}
_ROW: dict[bool, Schema] = {
    False: ("verdicts", prompts.ROW_SCHEMA),
    True: ("verdicts", prompts.ROW_SCHEMA_VERDICT_ONLY),
}
_content = itemgetter("content")

_FRESH_CONVERSATIONS = 1
_MAX_BUMPS = 3  # budget raises one call may go through (x4 each, up to shapes.BUDGET_CAP)


def _split(total: int, parts: int) -> list[int]:
    """Split a token count evenly; the first items take the remainder, so the sum is exact."""
    share, rest = divmod(total, parts)
    return [share + (1 if i < rest else 0) for i in range(parts)]


class _Unreadable(Exception):
    """A conversation whose reply stayed unreadable after its re-ask."""

    def __init__(self, error: JudgeParseError, tokens_in: int, tokens_out: int):
        super().__init__(str(error))
        self.error, self.tokens_in, self.tokens_out = error, tokens_in, tokens_out


class _Reply:
    """One completed call: the reply text, how it ended, what it cost, the budget it had."""

    __slots__ = ("factor", "finish", "text", "tokens_in", "tokens_out")

    def __init__(self, text: str, finish: str, tokens_in: int, tokens_out: int, factor: int):
        self.text, self.finish, self.factor = text, finish, factor
        self.tokens_in, self.tokens_out = tokens_in, tokens_out


class HttpJudgeBase(HttpClient):
    """An HTTP judge: the conversation on top of the client; providers give the shapes."""

    default_provider: str  # the registry provider of a judge created without a `spec`

    def __init__(
        self,
        model_name: str,
        settings: JudgeSettings,
        throttle: Throttle,
        stats: JudgeStats,
        *,
        spec: ProviderSpec | None = None,
        seams: Seams = DEFAULT,
    ) -> None:
        """The registry provider `spec`'s judge of `model_name` (`default_provider`'s without
        one): its API root (settings.base_url, then the provider's variable, then its URL), its
        key from the provider's variables (or settings.api_key_env) as `seams.keys` (the
        environment unless given) holds them, its first request shape; its transport and retry
        clock are the seams' (aiohttp and real waits by default)."""
        spec = spec or builtin_providers()[self.default_provider]
        base = self._api_root(spec.base(settings.base_url))
        model = f"{spec.id}/{model_name}"
        key = spec.key(model, base, settings.api_key_env, seams.keys)
        self.key_env = settings.api_key_env or " or ".join(spec.key_env)
        super().__init__(
            settings, throttle, stats, url=self._endpoint(base), api_key=key, seams=seams
        )
        self.model, self._name, self._base, self.spec = model, model_name, base, spec
        self.provider = spec.id
        # verdict-only replies (no reason per item): their own prompts and schemas
        self._bare = settings.verdict_only
        self._item_schema, self._row_schema = _ITEM[self._bare], _ROW[self._bare]
        # request bodies' fixed parts, by (shape version, budget, id of the schema); see openai
        self._templates: dict[tuple[int, int, int], tuple[Any, dict[str, Any] | None]] = {}
        self.shape = self._first_shape()
        self._unreadable_streak = 0  # replies in a row without a readable verdict (run-wide)

    @property
    def base_url(self) -> str:
        """The API root this judge posts under (its provider's batch API lives there too)."""
        return self._base

    # -- provider hooks
    @staticmethod
    @abc.abstractmethod
    def _api_root(url: str) -> str:
        """The API root the provider's URLs hang under, from the configured base URL."""

    @staticmethod
    @abc.abstractmethod
    def _endpoint(base: str) -> str:
        """The URL a judge call is POSTed to."""

    @abc.abstractmethod
    def _first_shape(self) -> RequestShape:
        """The request shape this model is sent first (adapted to rejections later)."""

    # -- provider hooks
    @abc.abstractmethod
    def identity(self) -> dict[str, object]: ...

    def _identity(self, **own: object) -> dict[str, object]:
        """What every HTTP judge's verdicts depend on, then the provider's `own` fields (in
        this order: the memo keys are made from it)."""
        s = self.settings
        return {
            "provider": self.spec.id,
            "model": self._name,
            "base_url": self._base,
            "temperature": s.temperature,
            "max_output_tokens": s.max_output_tokens,
            **own,
        }

    @abc.abstractmethod
    def _payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _text(self, data: dict[str, Any]) -> str: ...

    def _cached(self, data: dict[str, Any]) -> int:
        """Prompt tokens served from the provider's cache (a part of `_usage`'s input)."""
        return 0

    def _finish(self, data: dict[str, Any]) -> str:
        """How the reply ended: stop, length (cut off by the budget), refused, filtered."""
        return "stop"

    def _reshape(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The same conversation as `payload`, built again with the current shape."""
        return payload

    def _read(self, data: dict[str, Any]) -> tuple[str, str, tuple[int, int] | None, int]:
        """The reply's text, finish, usage and cached input tokens (the four hooks above;
        a provider may read them in one pass)."""
        return self._text(data), self._finish(data), self._usage(data), self._cached(data)

    # -- what a batch API needs: the same request bodies, the same reading of replies
    def build_payload(self, request: ItemRequest | None = None, *, row: Row | None = None
                      ) -> dict[str, Any]:  # fmt: skip
        """The request body this judge sends for one item (or, with `row`, one row's items)."""
        if request is not None:
            system, user = prompts.item_messages(request, self._bare)
            schema = self._item_schema
            budget = self.settings.max_output_tokens
        elif row is not None:
            system, user = prompts.row_messages(*row, self._bare)
            schema = self._row_schema
            budget = self.settings.max_output_tokens * len(row[2])
        else:
            raise ValueError("build_payload needs an ItemRequest or a row")
        messages = [{"role": "user", "content": user}]
        return self._payload(system, messages, schema, self.shape.budget(budget))

    def read_response(self, data: dict[str, Any], n_items: int | None = None) -> list[JudgeReply]:
        """Verdicts from a reply body (n_items None: one item; else a row of n_items), with its
        usage split evenly. Raises JudgeError: refused, filtered, truncated or unparseable."""
        text, finish, usage = self._text(data), self._finish(data), self._usage(data)
        tokens_in, tokens_out = self._counted(usage)
        self._check_finish(finish)
        try:
            if n_items is None:
                return [JudgeReply(self._parse_item(text), tokens_in, tokens_out)]
            verdicts = self._parse_row(text, n_items)
        except JudgeParseError as err:
            cause = "truncated" if finish == "length" else "unparseable"
            raise JudgeParseError(f"{self.model}: {err}", cause=cause) from err
        pairs = zip(verdicts, _split(tokens_in, n_items), _split(tokens_out, n_items), strict=True)
        return [JudgeReply(v, i, o) for v, i, o in pairs]

    def sent_shape(self) -> dict[str, object]:
        """What this run sends (after any adaptation), for run.json and the summary."""
        return self.shape.describe()

    def adapt_payload(self, err: JudgeError, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A body to send again after `payload` was rejected for its shape (a batch line's
        4xx), learned for the rest of the run as online; None when it is not about the shape."""
        if not err.status or self._learn(err.status, err.body, payload) is None:
            return None
        fresh = self._reshape(payload)
        return None if fresh == payload else fresh

    # -- one call: send, count, read
    async def _complete(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> _Reply:
        shape = self.shape
        factor, budget = shape.budget_factor, shape.budget(max_tokens)

        def build() -> dict[str, Any]:
            return self._payload(system, messages, schema, self.shape.budget(max_tokens))

        est = estimate_tokens(system, *map(_content, messages)) + budget
        payload = self._payload(system, messages, schema, budget)  # build(), as it is now
        data, _ = await self.post_json(self._url, self.call_headers(), payload, est, build)
        text, finish, usage, cached = self._read(data)
        if usage is not None and UNKNOWN not in usage:  # the usual reply: counts
            tokens_in, tokens_out = usage
            if not 0 <= cached <= tokens_in:  # of the input, or not a count
                cached = 0
        else:
            tokens_in, tokens_out = self._counted(usage)
            cached = 0
        stats = self.stats
        stats.input_tokens += tokens_in
        stats.output_tokens += tokens_out
        stats.cached_input_tokens += cached
        return _Reply(text, finish, tokens_in, tokens_out, factor)

    def _counted(self, usage: tuple[int, int] | None) -> tuple[int, int]:
        """A reply's (input, output) tokens: (0, 0) when it gave none, or counts that are not
        counts (UNKNOWN, `client.json_count`: that call's usage is unknown, said once a run)."""
        if usage is None:
            return 0, 0
        if UNKNOWN not in usage:
            return usage
        self._unknown_usage()
        return 0, 0

    def _check_finish(self, finish: str) -> None:
        if finish == "refused":
            self.stats.failures["refused"] += 1
            raise JudgeFatalError(f"{self.model}: the model refused to judge this item",
                                  cause="refused")  # fmt: skip
        if finish == "filtered":
            self.stats.failures["filtered"] += 1
            raise JudgeFatalError(f"{self.model}: the provider's content filter stopped the reply",
                                  cause="filtered")  # fmt: skip

    def _bump_budget(self, factor: int, max_tokens: int) -> bool:
        """A reply cut off by the budget: raise the run's budget (x4, bounded); False at the cap."""
        shape = self.shape
        if shape.budget_factor > factor:  # another call raised it meanwhile
            return True
        if shape.budget(max_tokens) >= BUDGET_CAP:
            return False
        shape.budget_factor *= 4
        self._adapted(f"completion budget x{shape.budget_factor} (replies were cut off)")
        return True

    async def _call_parsed(
        self, system: str, messages: list[Message], schema: Schema, parse: Callable[[str], T],
        max_tokens: int, first: _Reply | None = None,
    ) -> tuple[T | JudgeParseError, str, int, int]:  # fmt: skip
        """One call, read; a reply cut off by its budget is asked again with a larger budget
        (not re-asked: the model did nothing wrong). Refusals and filters raise. `first`: the
        reply of the first call, when the caller made it already."""
        spent_in = spent_out = 0
        for _ in range(1 + _MAX_BUMPS):
            if first is not None:
                reply, first = first, None
            else:
                reply = await self._complete(system, messages, schema, max_tokens)
            spent_in, spent_out = spent_in + reply.tokens_in, spent_out + reply.tokens_out
            self._check_finish(reply.finish)
            try:
                value = parse(reply.text)
            except JudgeParseError as err:
                if reply.finish != "length" or not self._bump_budget(reply.factor, max_tokens):
                    self._unreadable(reply.text)
                    cause = "truncated" if reply.finish == "length" else err.cause
                    return JudgeParseError(str(err), cause=cause), reply.text, spent_in, spent_out
                self.stats.retries += 1
            else:
                self._unreadable_streak = 0
                return value, reply.text, spent_in, spent_out
        return JudgeParseError("reply cut off", cause="truncated"), "", spent_in, spent_out

    def _unreadable(self, text: str) -> None:
        """Count a reply without a readable verdict; once `[judge] max_unreadable_replies`
        come in a row (any readable reply starts the count again), stop the run
        (`JudgeNoVerdictError`, exit 4): saying what the judge sent and what to change, before
        every item pays for its re-asks and fails alike."""
        self._unreadable_streak += 1
        limit = self.settings.max_unreadable_replies
        if limit and self._unreadable_streak >= limit:
            raise self._refuse(self._no_verdict(text, limit), JudgeNoVerdictError)

    def _no_verdict(self, text: str, limit: int) -> str:
        shown = printable(" ".join(text.split()), 200) or "(an empty reply)"
        if not self.settings.structured_output:
            schema = "turn structured outputs on ([judge] structured_output = true) "
            schema += "if the server takes a JSON schema (response_format)"
        elif self.shape.output == "json_schema":
            schema = "the server was sent a JSON schema (response_format) and ignored it: use "
            schema += "a server that applies it"
        else:
            schema = "this server takes no JSON schema (response_format), so the model must "
            schema += "follow the prompt's JSON instructions"
        other = "row" if self.settings.mode == "item" else "item"
        return (
            f"{limit} replies in a row held no readable verdict (the judge answers in a form "
            f'ctxprec cannot read); the last one said: "{shown}". Fix: use a model that '
            f"answers in JSON as the prompt asks (--model); {schema}; or try --mode {other}. "
            "[judge] max_unreadable_replies sets how many unreadable replies in a row stop the "
            "run (0: never)"
        )

    # -- the conversation: ask, re-ask once, start afresh once
    async def _ask(
        self, system: str, user: str, schema: Schema, parse: Callable[[str], T], reask: str,
        max_tokens: int, first: _Reply | None = None,
    ) -> tuple[T, int, int]:  # fmt: skip
        """A conversation: one call, and on an unreadable reply one re-ask showing the model its
        reply. A conversation that stays unreadable is started afresh once (a transient garbage
        reply twice in a row is not a broken model), then the item fails as `unparseable`.
        `first`: the reply of the conversation's first call, when the caller made it already."""
        spent_in = spent_out = 0
        held = 0
        for fresh in range(1 + _FRESH_CONVERSATIONS):
            held += 1
            if fresh:
                self.stats.retries += 1
            try:
                value, t_in, t_out = await self._conversation(
                    system, user, schema, parse, reask, max_tokens, first
                )
            except _Unreadable as bad:
                first = None
                spent_in, spent_out = spent_in + bad.tokens_in, spent_out + bad.tokens_out
                error = bad.error
                if error.cause == "truncated":
                    break
                continue
            return value, spent_in + t_in, spent_out + t_out
        self.stats.failures[error.cause] += 1
        if held > 1 and error.cause != "truncated":  # say how often it was really asked
            said = str(error).replace(
                "after one re-ask", f"in {held} conversations, each re-asked once"
            )
            error = JudgeParseError(said, cause=error.cause)
        raise error

    async def _conversation(
        self, system: str, user: str, schema: Schema, parse: Callable[[str], T], reask: str,
        max_tokens: int, reply: _Reply | None = None,
    ) -> tuple[T, int, int]:  # fmt: skip
        messages = [{"role": "user", "content": user}]
        first, text, tokens_in, tokens_out = await self._call_parsed(
            system, messages, schema, parse, max_tokens, reply
        )
        if not isinstance(first, JudgeParseError):
            return first, tokens_in, tokens_out
        if first.cause == "truncated":
            message = f"{self.model}: reply cut off at the largest completion budget ({first})"
            error = JudgeParseError(redact(message), cause="truncated")
            raise _Unreadable(error, tokens_in, tokens_out)
        self.stats.reasks += 1
        messages += [
            {"role": "assistant", "content": text.strip() or "(empty reply)"},
            {"role": "user", "content": reask},
        ]
        again, text2, more_in, more_out = await self._call_parsed(
            system, messages, schema, parse, max_tokens
        )
        if not isinstance(again, JudgeParseError):
            return again, tokens_in + more_in, tokens_out + more_out
        clip = " ".join(text2.split())[:200]
        message = f"{self.model}: reply unreadable after one re-ask ({again}); reply: {clip!r}"
        error = JudgeParseError(redact(message), cause=again.cause)
        raise _Unreadable(error, tokens_in + more_in, tokens_out + more_out)

    # -- reading replies: verdict-only keeps no reason, even one the model wrote anyway
    def _parse_item(self, text: str) -> Verdict:
        verdict = parse_verdict(text)
        return Verdict(verdict.relevant, "") if self._bare else verdict

    def _parse_row(self, text: str, n_items: int) -> list[Verdict]:
        verdicts = parse_row_verdicts(text, n_items)
        return [Verdict(v.relevant, "") for v in verdicts] if self._bare else verdicts

    # -- the Judge protocol
    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        system, user = prompts.item_messages(request, self._bare)
        max_tokens, schema = self.settings.max_output_tokens, self._item_schema
        # the conversation's first call, made here: a readable reply that stopped on its own
        # (nearly every call) is the verdict at once; anything else goes on in `_ask` from it
        messages = [{"role": "user", "content": user}]
        reply = await self._complete(system, messages, schema, max_tokens)
        if reply.finish == "stop":
            try:
                verdict = self._parse_item(reply.text)
            except JudgeParseError:
                pass  # counted as unreadable once `_ask` reads it again
            else:
                self._unreadable_streak = 0
                return JudgeReply(verdict, reply.tokens_in, reply.tokens_out)
        reask = _REASK_ITEM_VERDICT_ONLY if self._bare else _REASK_ITEM
        verdict, tokens_in, tokens_out = await self._ask(
            system, user, schema, self._parse_item, reask, max_tokens, reply
        )
        return JudgeReply(verdict, tokens_in, tokens_out)

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        """All items in one call; output budget max_output_tokens per item; usage split evenly.

        A reply with missing, extra or repeated verdicts (or otherwise unreadable) is re-asked
        once, showing the model its reply; if it is still wrong the row is judged item by item
        (`stats.row_fallbacks`), the row call's tokens shared by its items. An item that then
        fails on its own fails alone: `RowItemsError` carries each item's reply or error."""
        if not items:
            return []
        n = len(items)
        system, user = prompts.row_messages(query, expected, items, self._bare)
        reask = _REASK_ROW.format(n=n, last=n - 1, reason="" if self._bare else _REASK_ROW_REASON)
        try:
            verdicts, tokens_in, tokens_out = await self._conversation(
                system, user, self._row_schema, lambda text: self._parse_row(text, n), reask,
                self.settings.max_output_tokens * n,
            )  # fmt: skip
        except _Unreadable as bad:
            return await self._row_per_item(query, expected, items, bad.tokens_in, bad.tokens_out)
        pairs = zip(verdicts, _split(tokens_in, n), _split(tokens_out, n), strict=True)
        return [JudgeReply(v, i, o) for v, i, o in pairs]

    async def _row_per_item(
        self, query: str, expected: str | None, items: Sequence[str], spent_in: int,
        spent_out: int,
    ) -> list[JudgeReply]:  # fmt: skip
        """Judge a row's items one call each (concurrently, under the run's throttle)."""
        self.stats.row_fallbacks += 1
        n = len(items)
        results: list[JudgeReply | JudgeError | None] = [None] * n
        other: list[Exception] = []

        async def one(i: int) -> None:
            try:
                results[i] = await self.judge_item(ItemRequest(query, expected, items[i]))
            except JudgeError as err:
                results[i] = err
            except Exception as err:  # e.g. the judge refused the run: raised as is, below
                other.append(err)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        if other:
            raise other[0]
        shares = zip(results, _split(spent_in, n), _split(spent_out, n), strict=True)
        out: list[JudgeReply | JudgeError] = []
        for r, extra_in, extra_out in shares:
            if isinstance(r, JudgeReply):
                r = JudgeReply(r.verdict, r.input_tokens + extra_in, r.output_tokens + extra_out)
            assert r is not None
            out.append(r)
        replies = [r for r in out if isinstance(r, JudgeReply)]
        if len(replies) < n:
            raise RowItemsError(out)
        return replies

    async def write_reason(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        reply = await self._complete(
            _REASON_SYSTEM, messages, None, self.settings.max_output_tokens
        )
        if not reply.text.strip():
            raise JudgeParseError(f"{self.model}: empty reply to the reason prompt", cause="empty")
        return reply.text.strip()
