"""Ctrl-C and SIGTERM: the first one stops the command, later ones are ignored. Inside an event
loop the stop cancels the run, whose shutdown still writes every verdict that finished; outside
one it is a KeyboardInterrupt. The CLI turns either into exit 130 (143 for SIGTERM).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["Stop", "stoppable"]

T = TypeVar("T")


class Stop:
    """The process's one stop request, made by the first SIGINT or SIGTERM."""

    signum: int | None = None  # the signal that asked for the stop
    _cancel: Callable[[], None] | None = None  # set while `stoppable` runs an event loop's work

    @classmethod
    def install(cls) -> dict[int, Any]:
        """Handle SIGINT and SIGTERM in this (main) thread; returns the handlers it replaced."""
        return {sig: signal.signal(sig, cls._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    @classmethod
    def _on_signal(cls, signum: int, frame: Any) -> None:
        if cls.signum is not None:
            return  # a stop is under way: a second Ctrl-C must not cut its shutdown short
        cls.signum = signum
        for sig in (signal.SIGINT, signal.SIGTERM):  # ignored from now on, interpreter exit
            signal.signal(sig, signal.SIG_IGN)  # included (it resets Python-level handlers)
        if cls._cancel is None:
            raise KeyboardInterrupt  # plain Python code (start-up, a blocking step)
        cls._cancel()

    @classmethod
    def reset(cls) -> None:
        cls.signum, cls._cancel = None, None


async def stoppable(fn: Callable[[], Awaitable[T]]) -> T:
    """Await `fn`; a stop signal cancels it (its `finally` blocks run to the end, as on any
    cancellation), then the stop surfaces as KeyboardInterrupt."""
    loop = asyncio.get_running_loop()
    with anyio.CancelScope() as scope:

        def cancel() -> None:
            loop.call_soon_threadsafe(scope.cancel)

        Stop._cancel = cancel
        try:
            result = await fn()
        finally:
            Stop._cancel = None
    if Stop.signum is not None or scope.cancelled_caught:
        raise KeyboardInterrupt
    return result
