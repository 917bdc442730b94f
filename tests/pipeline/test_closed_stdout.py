"""A closed stdout ends the printing, never the exit code: `ctxprec score … --fail-under 0.99
| (exec 0<&-)` exited 0 in 3 of 3 runs (5 without the pipe), and with failed rows and
`| head -1` the exit codes were 1 0 1 1 0 1 (a judge that cannot be reached now stops the run
with exit 4: the code kept here). What ctxprec prints has its control characters and bidi
controls escaped. Each run here is the real command in its own process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.inputs import REPO, SAMPLE

_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPREC_", "OPENAI_"))}


def ctxprec(*args: object, stdout: int, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**_ENV, "CTXPREC_CACHE_DIR": str(tmp / "memo"), "NO_PROXY": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "ctxprec", *map(str, args), "--progress", "off"],
        cwd=REPO,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


def closed_reader() -> tuple[int, int]:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before ctxprec writes a line: `| (exec 0<&-)`
    return read, write


def dead_judge() -> list[str]:
    """Flags for an OpenAI judge on a loopback port nothing listens on: no call reaches it, so
    the run stops with exit 4."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    return ["--model", "openai/judge-1", "--base-url", url, "--max-retries", "0",
            "--retry-budget", "0", "--no-memo"]  # fmt: skip


def test_a_failed_gate_exits_5_when_stdout_is_closed(tmp_path: Path) -> None:
    _, write = closed_reader()
    try:
        done = ctxprec(
            "score", SAMPLE, "-o", tmp_path / "out", "--fail-under", "0.99", stdout=write,
            tmp=tmp_path,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out" / "_SUCCESS").exists()


def test_a_dead_judge_exits_4_when_stdout_is_closed(tmp_path: Path) -> None:
    _, write = closed_reader()
    try:
        done = ctxprec("score", SAMPLE, "-o", tmp_path / "out", *dead_judge(), stdout=write,
                       tmp=tmp_path)  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("run", range(3))
def test_a_dead_judge_exits_4_into_head(run: int, tmp_path: Path) -> None:
    flags = " ".join(f"'{f}'" for f in dead_judge())
    env = {**_ENV, "CTXPREC_CACHE_DIR": str(tmp_path / "memo")}
    command = (
        f"'{sys.executable}' -m ctxprec score '{SAMPLE}' -o '{tmp_path / 'out'}' {flags} "
        '--progress off | head -1; echo "exit ${PIPESTATUS[0]}"'
    )
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "exit 4", done.stderr


def test_a_good_run_into_a_closed_stdout_exits_0_quietly(tmp_path: Path) -> None:
    _, write = closed_reader()
    try:
        done = ctxprec("score", SAMPLE, "-o", tmp_path / "out", stdout=write, tmp=tmp_path)
    finally:
        os.close(write)
    assert done.returncode == 0
    assert "Error" not in done.stderr


def test_control_and_bidi_characters_are_escaped_in_what_ctxprec_prints(tmp_path: Path) -> None:
    out = tmp_path / "out\x1bc\x07\u202egnp.exe"  # ESC c resets a terminal
    done = ctxprec("score", SAMPLE, "-o", out, stdout=subprocess.PIPE, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "\x1b" not in printed
    assert "\u202e" not in printed
    assert "\\x1bc\\x07\\u202egnp.exe" in done.stdout
