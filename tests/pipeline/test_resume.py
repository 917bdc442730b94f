"""Kill and resume with real processes: SIGKILL at random moments, Ctrl-C, then the same command
again; the result equals an uninterrupted run and finished judge calls are not repeated.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli import main as cli_main
from ctxprec.cli.process import INTERRUPTED
from tests.fakes.inputs import HOTPOT_MAP, REPO
from tests.fakes.runs import fake_stats, judge_process

pytestmark = pytest.mark.slow  # real processes killed and resumed

CONCURRENCY = 8


def command(src: Path, out: Path, concurrency: int = CONCURRENCY) -> list[str]:
    """`python -m ctxprec score ...`: the `ctxprec` command, start-up included (a stop
    signal during its imports ends it as a stop does later: `ctxprec.cli.process.hold_signals`)."""
    return [
        sys.executable,
        "-m",
        "ctxprec",
        "score",
        str(src),
        "-o",
        str(out),
        "--model",
        "openai/judge",
        *HOTPOT_MAP,
        "--batch-rows",
        "10",
        "--concurrency",
        str(concurrency),
        "--progress",
        "off",
    ]


def environment(url: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="sk-test-resume", CTXPREC_CACHE_DIR=str(cache))
    return env


def table(out: Path) -> pl.DataFrame:
    cols = ["id", "score", "status", "verdicts", "relevant_count", "context_count"]
    return pl.read_parquet(out / "*.parquet").select(cols).sort("id")


@pytest.fixture
def src(hotpot: Path, tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pl.read_parquet(hotpot).head(150).write_parquet(path)
    return path


def test_sigkill_at_random_moments_then_resume(src: Path, tmp_path: Path, server: str) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = environment(server, cache)
    rng = random.Random(20261130)
    kills = 0
    for delay in (0.05, *(rng.uniform(0.4, 2.0) for _ in range(3))):
        proc = subprocess.Popen(
            command(src, out),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        assert not (out / "_SUCCESS").exists() or proc.returncode == 0
    assert kills >= 2
    done = subprocess.run(command(src, out), cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (out / "_SUCCESS").exists()
    resumed_calls = int(fake_stats(server)["total"])

    clean_out, clean_cache = tmp_path / "clean", tmp_path / "clean-cache"
    clean = subprocess.run(
        command(src, clean_out),
        cwd=REPO,
        env=environment(server, clean_cache),
        capture_output=True,
        text=True,
    )
    assert clean.returncode == 0, clean.stderr
    unique_calls = int(fake_stats(server)["total"]) - resumed_calls  # type: ignore[arg-type]

    resumed = table(out)
    assert resumed.get_column("id").is_unique().all()
    assert resumed.equals(table(clean_out))
    # at most the calls in flight at each kill were repeated
    assert unique_calls <= resumed_calls <= unique_calls + kills * CONCURRENCY


@pytest.fixture
def fast_server() -> Iterator[str]:
    """The fake judge in its own process, answering in 4 ± 2 ms."""
    with judge_process("--latency-ms", "4", "--jitter-ms", "2") as url:
        yield url


def _calls(url: str) -> int:
    return int(fake_stats(url)["total"])


def _wait_for_calls(url: str, target: int, proc: subprocess.Popen[bytes]) -> bool:
    """Until the fake judge has had `target` calls in all; False when the run ended first."""
    while _calls(url) < target:
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return True


def test_sigkills_at_16_in_flight_repeat_at_most_the_calls_in_flight(
    hotpot: Path, tmp_path: Path, fast_server: str
) -> None:
    """SIGKILLs at seeded moments of a run with 16 calls in flight, each while another run
    sharing the memo folder holds its write lock (a long group commit: the memo writer cannot
    write, finished verdicts pile up), then the same command: each kill repeats at most the 16
    calls in flight, never a finished one. (Finished verdicts used to wait in memory for the
    memo writer's next group commit and die with the process: two kills repeated 34 calls.)
    Each paid verdict is appended to the run's journal before its worker takes the next call."""
    out, cache, in_flight = tmp_path / "out", tmp_path / "cache", 16
    src = tmp_path / "in.parquet"
    pl.read_parquet(hotpot).write_parquet(src)  # 500 rows, ~5,000 unique calls
    env = environment(fast_server, cache)
    rng = random.Random(20261202)
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen(command(src, out, in_flight), cwd=REPO, env=env)
        # a seeded moment: after 50-300 calls of this run, the lock; 100-300 calls later, the kill
        start, locked, killed = _calls(fast_server), rng.randint(50, 300), rng.randint(100, 300)
        if _wait_for_calls(fast_server, start + locked, proc):
            other_run = sqlite3.connect(cache / "cache.db", isolation_level=None, timeout=60)
            other_run.execute("BEGIN IMMEDIATE")
            if _wait_for_calls(fast_server, start + locked + killed, proc):
                proc.send_signal(signal.SIGKILL)
                kills += 1
            other_run.execute("ROLLBACK")
            other_run.close()
        proc.wait()
    assert kills == 4
    done = subprocess.run(
        command(src, out, in_flight), cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    resumed_calls = _calls(fast_server)
    assert fake_stats(fast_server)["max_in_flight"] <= in_flight
    assert not list((cache / "journal").glob("*"))  # replayed, then removed; the last one too

    clean_out, clean_env = tmp_path / "clean", environment(fast_server, tmp_path / "clean-cache")
    clean = subprocess.run(
        command(src, clean_out, in_flight), cwd=REPO, env=clean_env, capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stderr
    unique_calls = _calls(fast_server) - resumed_calls
    assert table(out).equals(table(clean_out))
    repeated = resumed_calls - unique_calls
    assert 0 <= repeated <= kills * in_flight, (repeated, kills)


def test_ctrl_c_stops_cleanly_and_keeps_finished_parts(
    src: Path, tmp_path: Path, server: str
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = environment(server, cache)
    proc = subprocess.Popen(
        command(src, out),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not list(out.glob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "resume" in err
    assert "Traceback" not in err
    kept = list(out.glob("*.parquet"))
    assert kept
    assert not (out / "_SUCCESS").exists()
    calls_before = int(fake_stats(server)["total"])
    done = subprocess.run(command(src, out), cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert table(out).height == 150
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert run["rows_skipped"] >= 10  # finished parts were not redone
    assert int(fake_stats(server)["total"]) - calls_before < 1500  # type: ignore[arg-type]


def test_signals_at_many_moments_end_cleanly_and_keep_every_finished_verdict(
    src: Path, tmp_path: Path, server: str
) -> None:
    """A seeded loop of SIGINT and SIGTERM across the run (workers mid-call, parts mid-write,
    the run mid-shutdown: some moments get a second signal 30 ms after the first): each ends
    with 130 / 143 and the resume line, never an internal error; finished verdicts survive, so
    the resumed output equals a clean run's and only calls in flight were repeated."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = environment(server, cache)
    rng = random.Random(20261202)
    stops = 0
    for n in range(10):
        sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
        proc = subprocess.Popen(
            command(src, out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        time.sleep(rng.uniform(0.6, 2.6))
        if proc.poll() is None:
            proc.send_signal(sig)
            if n % 3 == 2:  # a second signal while the first one's shutdown runs
                time.sleep(0.03)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            stops += 1
        _, err = proc.communicate(timeout=60)
        assert "internal error" not in err, err
        assert "Traceback" not in err, err
        if proc.returncode != 0:
            assert proc.returncode in (130, 143), err
            assert "run the same command again to resume" in err, err
            assert not (out / "_SUCCESS").exists()
    assert stops >= 5
    done = subprocess.run(command(src, out), cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    resumed_calls = int(fake_stats(server)["total"])

    clean_out = tmp_path / "clean"
    clean_env = environment(server, tmp_path / "clean-cache")
    clean = subprocess.run(
        command(src, clean_out), cwd=REPO, env=clean_env, capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stderr
    unique_calls = int(fake_stats(server)["total"]) - resumed_calls  # type: ignore[arg-type]
    assert table(out).equals(table(clean_out))
    # a stopped run repeats at most the calls in flight when it stopped
    assert unique_calls <= resumed_calls <= unique_calls + stops * CONCURRENCY


def test_a_signal_during_start_up_is_a_clean_stop(src: Path, tmp_path: Path, server: str) -> None:
    """SIGINT or SIGTERM while the command is still importing (before the CLI's handlers are
    installed): the resume line and 130 / 143, nothing written, never a traceback; the line is
    the one a stop prints later."""
    env = environment(server, tmp_path / "cache")
    ended = 0
    for n, delay in enumerate((0.12, 0.16, 0.2, 0.25, 0.3, 0.4)):
        sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
        out = tmp_path / f"out{n}"
        proc = subprocess.Popen(
            command(src, out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, err
        assert "internal error" not in err, err
        assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
        assert err.strip().endswith(INTERRUPTED), err
        assert not (out / "_SUCCESS").exists()
        ended += 1
    assert ended == 6
    assert INTERRUPTED in _interrupted_line()


def _interrupted_line() -> str:
    """What ctxprec.cli.main prints when a stop ends a command."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        assert cli_main._interrupted() == 130
    return buffer.getvalue()
