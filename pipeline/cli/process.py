"""How the `ctxprec` command's process starts and ends: stop signals held during the imports
before the CLI's own handlers are in place (`hold_signals`), and the exit without the
interpreter's teardown once a command is done (`leave`). Used by the console script's entry
(`ctxprec.__main__`) and by `python -m ctxprec.cli.main`; it imports no other ctxprec module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["INTERRUPTED", "hold_signals", "leave", "release_signals"]

# the line a stop ends a command with, at start-up here and later in ctxprec.cli.main
INTERRUPTED = (
    "ctxprec: interrupted; finished parts and verdicts are kept; run the same command again to "
    "resume"
)


def hold_signals(early: Sequence[int] = ()) -> None:
    """SIGINT and SIGTERM before the CLI's own handlers are in place (`ctxprec.run.interrupt`,
    installed first thing by `ctxprec.cli.main.main`): the imports before them take ~0.2 s,
    more on a loaded machine, and a signal then was a KeyboardInterrupt traceback or a bare kill.
    Nothing has been read or written yet, so the command ends at once, as a stop does later:
    the resume line and exit 130 (143 for SIGTERM)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_at_start)
    if early:  # `early`: the stops recorded before this module was loaded (ctxprec.__main__)
        _stop_at_start(early[0], None)


def release_signals() -> None:
    """Python's own handling again where `hold_signals`' handler is back in place (the CLI
    gives back the handlers it found when a command ends without a stop): a signal after the
    command is not a stop of it."""
    for sig, default in (
        (signal.SIGINT, signal.default_int_handler),
        (signal.SIGTERM, signal.SIG_DFL),
    ):
        if signal.getsignal(sig) is _stop_at_start:
            signal.signal(sig, default)


def _stop_at_start(signum: int, frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError):
        print(INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(143 if signum == signal.SIGTERM else 130)


_ENDING_S = 1.0  # how long `_needs_teardown` waits for threads that are ending


def _needs_teardown() -> bool:
    """True while something still relies on the interpreter's normal shutdown: a thread that is
    not a daemon (it would be joined), or a child process of `multiprocessing` (it would be
    reaped). Threads that are ending get up to `_ENDING_S` to finish first: anyio's worker
    threads are told to stop when the run's event loop ends and leave a moment later."""
    main_thread = threading.main_thread()
    deadline = time.monotonic() + _ENDING_S
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return True
    multiprocessing = sys.modules.get("multiprocessing")
    return multiprocessing is not None and bool(multiprocessing.active_children())


def _stopped() -> bool:
    """True after a Ctrl-C or SIGTERM stopped the command. Its exit code must then be 130
    (143) whatever the teardown would meet: CPython can leave a caught KeyboardInterrupt
    marked as unhandled (seen when the signal lands while a module imports), and then ends the
    process by SIGINT at exit, not with the code the command returned."""
    interrupt = sys.modules.get("ctxprec.run.interrupt")
    return interrupt is not None and interrupt.Stop.signum is not None


def leave(code: int) -> int:
    """End the process with `code`, without the interpreter's teardown when nothing needs it.

    Every file ctxprec writes is closed (and every memo transaction committed) before the
    command returns; what is left at exit is freeing Polars', Arrow's and aiohttp's modules one
    object at a time, ~0.1 s of CPU, more than the bare judge loop's whole start-up. So: run
    the exit handlers (logging's flush among them), flush stdout and stderr, and `os._exit`.
    When a non-daemon thread or a child process is still alive, Python's own exit runs instead
    (it joins and reaps them), unless a signal stopped the command. Returns `code` only when
    Python's exit runs."""
    if _needs_teardown() and not _stopped():
        return code
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # a reader gone (`| head`) or a closed stream: there is nothing more to say to it
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
