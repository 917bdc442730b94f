"""What every judge is: the request it sees, the verdict it gives, and the hooks it calls.

A judge turns (query, expected output, one context item) into a `Verdict`. Rate limits and
counters live outside the judge and reach it through `Throttle` and `JudgeStats`.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ctxprec.storage.core.errors import JudgeError
from ctxprec.storage.core.verdict import JudgeReply, Verdict

__all__ = [
    "ItemRequest",
    "Judge",
    "JudgeStats",
    "JudgeWrapper",
    "NullThrottle",
    "RowItemsError",
    "SyncDecider",
    "Throttle",
    "estimate_tokens",
    "tokens_for_chars",
]


@dataclass(frozen=True, slots=True)
class ItemRequest:
    """What the judge sees for one item. `expected` None means: judge against the query alone."""

    query: str
    expected: str | None
    item: str


def estimate_tokens(*texts: str | None) -> int:
    """Cheap token estimate (about 4 characters a token), used before a call for TPM budgets."""
    return tokens_for_chars(sum(map(len, filter(None, texts))))


def tokens_for_chars(chars: int) -> int:
    """`estimate_tokens` of texts of `chars` characters in all."""
    return chars // 4 + 1


@dataclass
class JudgeStats:
    """Counters shared by all calls of one run (plain ints: updated on the event loop only)."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    reasks: int = 0
    row_fallbacks: int = 0  # --mode row: rows judged item by item after a wrong row reply
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0  # of input_tokens, read from the provider's prompt cache
    usage_unknown: int = 0  # replies whose token counts were not counts (counted as 0 tokens)
    pauses: int = 0  # run-wide pauses for a long Retry-After
    failures: Counter[str] = field(default_factory=Counter)
    errors_by_cause: Counter[str] = field(default_factory=Counter)
    # what the judge changed in its requests for the rest of the run (change -> times seen)
    adaptations: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "reasks": self.reasks,
            "row_fallbacks": self.row_fallbacks,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "usage_unknown": self.usage_unknown,
            "pauses": self.pauses,
            "failures": dict(self.failures),
            "errors_by_cause": dict(self.errors_by_cause),
            "adaptations": dict(self.adaptations),
        }


class RowItemsError(JudgeError):
    """A row judged item by item (`--mode row` fallback) where some items failed on their own:
    `results` holds, per item in order, its reply or its error (the others are good)."""

    def __init__(self, results: Sequence[JudgeReply | JudgeError]) -> None:
        errors = [r for r in results if isinstance(r, JudgeError)]
        super().__init__(str(errors[0]), cause=errors[0].cause)
        self.results = list(results)


class Throttle(Protocol):
    """Admission control for HTTP attempts: calls in flight, requests/min, tokens/min."""

    def slot(self, est_tokens: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one call-in-flight place, after waiting for RPM and TPM budget."""
        ...

    def rate_limited(self, retry_after: float | None) -> None:
        """The server said 429: pause everyone for retry_after (or a backoff) and slow down."""
        ...

    def used_tokens(self, estimated: int, actual: int) -> None:
        """Correct the TPM budget once the real usage of a call is known."""
        ...


class NullThrottle:
    """A throttle that admits everything at once (offline judge, unit tests)."""

    @contextlib.asynccontextmanager
    async def slot(self, est_tokens: int) -> AsyncIterator[None]:
        yield

    def rate_limited(self, retry_after: float | None) -> None:
        return None

    def used_tokens(self, estimated: int, actual: int) -> None:
        return None


@runtime_checkable
class SyncDecider(Protocol):
    """A judge that needs no I/O (the offline heuristic) may also decide synchronously; the
    pipeline then judges its items inline instead of through the worker pool."""

    def decide(self, query: str, expected: str | None, item: str) -> Verdict: ...


@runtime_checkable
class Judge(Protocol):
    """A relevance judge. `identity()` holds everything that changes a verdict (memo key)."""

    model: str

    def identity(self) -> dict[str, object]: ...

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        """Judge one item; raise `JudgeError` when the call finally failed."""
        ...

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        """Judge all items in one call (per-row mode); count mismatch raises JudgeParseError."""
        ...

    async def write_reason(self, prompt: str) -> str:
        """Free text for the optional LLM-written reason."""
        ...

    async def aclose(self) -> None: ...


class JudgeWrapper:
    """A judge around another (`inner`): each method hands the call on unchanged; a subclass
    overrides the one it changes (e.g. `judge_item`, to replay or record verdicts)."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner
        self.model = inner.model

    def identity(self) -> dict[str, object]:
        return self.inner.identity()

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        return await self.inner.judge_item(request)

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        return await self.inner.judge_row(query, expected, items)

    async def write_reason(self, prompt: str) -> str:
        return await self.inner.write_reason(prompt)

    async def aclose(self) -> None:
        await self.inner.aclose()
