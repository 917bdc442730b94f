"""The `ctxprec` console script, kept outside ctxprec's three packages on purpose.

ctxprec installs the top-level packages `pipeline`, `connectors` and `storage`; PyPI has other
projects with exactly those names. When one of them (or a folder of that name on PYTHONPATH)
shadows ours, a console script that imports `pipeline.cli.main` directly dies with a traceback
before any ctxprec code runs. This module runs first: it imports each package, checks the
marker our `__init__.py` files set (`__ctxprec__`), and says what to do when one is not ours;
only then does it load the CLI (the one import of a ctxprec module inside a function). When the
command is done it ends the process without the interpreter's teardown (`leave`). A stop signal
during those imports ends the command as a stop does later (`hold_signals`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from types import ModuleType

__all__ = ["check_packages", "hold_signals", "main", "release_signals"]

PACKAGES = ("storage", "connectors", "pipeline")  # leaf first: each imports those before it
CLASH_EXIT = 2  # an environment problem found before any judge call, like a bad config


def _where(name: str) -> str:
    """Where the package `name` that Python finds first lives (found, not imported)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    where = spec.origin if spec.origin not in (None, "namespace") else None
    where = where or ", ".join(spec.submodule_search_locations or [])
    return f" ({where})" if where else ""


def _problem(name: str) -> str | None:
    try:
        module: ModuleType = importlib.import_module(name)
    except Exception as exc:  # another project's package may fail in any way
        return f"the package `{name}` found first{_where(name)} fails to import: {exc!r}"
    if getattr(module, "__ctxprec__", False) is not True:
        return f"the package `{name}` found first is not ctxprec's{_where(name)}"
    return None


def check_packages() -> str | None:
    """None when pipeline, connectors and storage are ctxprec's own; else what to do."""
    for name in PACKAGES:
        if (problem := _problem(name)) is not None:
            source = installed_from()
            return (
                f"ctxprec: cannot start: {problem}. ctxprec installs the top-level packages "
                "pipeline, connectors and storage, and other PyPI projects use the same names "
                "(another distribution installed into this environment, or a folder of that "
                "name on PYTHONPATH or in the current folder). Install ctxprec in a virtual "
                "environment of its own (python3 -m venv .venv && .venv/bin/pip install "
                f"{source}), or remove the other one (pip uninstall {name}, then "
                f"pip install --force-reinstall {source})"
            )
    return None


def installed_from() -> str:
    """What to give pip to install this ctxprec again: the checkout or wheel it came from
    (its distribution's direct_url.json, PEP 610), since ctxprec is not on the package index;
    a placeholder naming both when pip recorded no source."""
    try:
        from importlib import metadata

        text = metadata.distribution("ctxprec").read_text("direct_url.json")
    except Exception:  # not installed by pip, or no record of its source
        text = None
    if text:
        import json
        from urllib.parse import unquote, urlsplit

        try:
            info = json.loads(text)
            url = urlsplit(str(info["url"]))
        except (ValueError, KeyError, TypeError):
            url = None
        if url is not None and url.scheme == "file" and url.path:
            path = unquote(url.path)
            editable = (info.get("dir_info") or {}).get("editable")
            return f"-e {path}" if editable else path
    return "<the ctxprec checkout or wheel you installed from>"


# the line pipeline.cli.main prints when a stop ends a command (a test holds the two equal)
INTERRUPTED = (
    "ctxprec: interrupted; finished parts and verdicts are kept; run the same command again to "
    "resume"
)


def hold_signals() -> None:
    """SIGINT and SIGTERM before the CLI's own handlers are in place (`pipeline.run.interrupt`,
    installed first thing by `pipeline.cli.main.main`): the imports before them take ~0.2 s,
    more on a loaded machine, and a signal then was a KeyboardInterrupt traceback or a bare kill.
    Nothing has been read or written yet, so the command ends at once, as a stop does later:
    the resume line and exit 130 (143 for SIGTERM)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_at_start)


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


def main() -> int:
    hold_signals()
    if (message := check_packages()) is not None:
        print(message, file=sys.stderr)
        return CLASH_EXIT
    if sys.argv[1:] == ["--version"]:  # what argparse prints, without building the parser
        version: str = importlib.import_module("pipeline.version").__version__
        print(f"ctxprec {version}")
        return 0
    cli = importlib.import_module("pipeline.cli.main")
    code: int = cli.main()
    release_signals()
    return leave(code)


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
    interrupt = sys.modules.get("pipeline.run.interrupt")
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


if __name__ == "__main__":
    sys.exit(main())
