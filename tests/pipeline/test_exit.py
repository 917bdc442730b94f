"""The console script ends without the interpreter's teardown (`ctxprec.cli.process.leave`): exit
handlers still run, stdout and stderr are complete, the exit code is the command's; a live
non-daemon thread or child process gets Python's normal exit instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.fakes.inputs import REPO
from tests.pipeline.test_hot_path import write_fixed_input


def _entry(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


_PROBE = (
    "import atexit, sys\n"
    "from ctxprec.__main__ import main\n"
    "atexit.register(lambda: print('exit handler ran', file=sys.stderr, flush=True))\n"
    "sys.argv = ['ctxprec', *sys.argv[1:]]\n"
    "code = main()\n"
    "print('after main', code, file=sys.stderr)\n"  # reached only when Python exits normally
    "sys.exit(code)\n"
)


def test_a_score_run_leaves_fast_with_its_output_and_exit_handlers(tmp_path: Path) -> None:
    data = write_fixed_input(tmp_path / "in.parquet", 20)
    out = tmp_path / "out"
    argv = ["score", str(data), "-o", str(out), "--progress", "off", "--quiet"]
    done = _entry(_PROBE, *argv, "--cache-dir", str(tmp_path / "memo"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "exit handler ran" in done.stderr
    assert "after main" not in done.stderr  # os._exit: no teardown
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["rows"]["total"] == 20
    assert (out / "summary.md").is_file()


def test_the_exit_code_of_a_refused_command_survives_the_fast_exit(tmp_path: Path) -> None:
    done = _entry(_PROBE, "score", str(tmp_path / "missing.parquet"), "-o", "o", cwd=tmp_path)
    assert done.returncode == 2
    assert "ctxprec: error:" in done.stderr
    assert "after main" not in done.stderr


def test_a_live_non_daemon_thread_gets_the_normal_exit(tmp_path: Path) -> None:
    code = (
        "import sys, threading\n"
        "from ctxprec.__main__ import main\n"
        "stop = threading.Event()\n"
        "t = threading.Thread(target=lambda: (stop.wait(), print('thread joined', flush=True)))\n"
        "t.start()\n"
        "sys.argv = ['ctxprec', 'providers']\n"
        "code = main()\n"  # the thread is alive until after this returns
        "print('after main', code, flush=True)\n"
        "stop.set()\n"
        "sys.exit(code)\n"
    )
    done = _entry(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["after main 0", "thread joined"]


def test_the_start_up_signal_handlers_are_given_back_after_the_command() -> None:
    """`hold_signals` covers the CLI's imports only: once a command has ended without a stop
    (the CLI gave back the handlers it found, which were these), Python's own handling is back;
    a stopped command's ignored signals stay ignored."""
    from ctxprec.cli import process

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        process.hold_signals()
        assert signal.getsignal(signal.SIGINT) is process._stop_at_start
        process.release_signals()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop under way ignores later signals
        process.release_signals()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
