"""One writer per output folder, with real processes: two runs started into one OUTDIR (a cron
job overlapping the last one) never judge an item twice; the second exits 2 at once saying who
holds the folder, or with --wait-lock waits and then has nothing left to pay for."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread

pytestmark = pytest.mark.slow  # two real ctxprec processes race for the lock

ROWS = 40


@pytest.fixture
def slow_judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJudgeServer]:
    """100 ms a call, so the first run is still judging when the second starts."""
    with FakeJudgeThread(FakeJudgeConfig(latency_ms=100)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-one-writer-0123456789")
        yield server


def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    ids = range(ROWS)
    pq.write_table(
        pa.table(
            {
                "id": [f"r{i}" for i in ids],
                "query": [f"question {i}?" for i in ids],
                "contexts": [[f"passage {i}", f"other passage {i}"] for i in ids],
            }
        ),
        path,
    )
    return path


def start(src: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "ctxprec.cli.main", "score", str(src), "-o", str(out)]
    cmd += ["--model", "openai/judge", "--concurrency", "2", "--batch-rows", "5", "--quiet"]
    return subprocess.Popen(
        [*cmd, *extra],
        cwd=REPO,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lock(out: Path, first: subprocess.Popen[str]) -> None:
    lock = out / "_ctxprec" / "lock"
    for _ in range(3000):
        if lock.exists() or first.poll() is not None:
            break
        time.sleep(0.01)
    assert lock.exists(), "the first run never took the lock"


def test_second_run_into_a_locked_folder_exits_2_at_once(
    tmp_path: Path, slow_judge: FakeJudgeServer
) -> None:
    src, out = source(tmp_path), tmp_path / "out"
    first = start(src, out)
    wait_for_lock(out, first)
    second = start(src, out)
    _, err2 = second.communicate(timeout=120)
    assert first.poll() is None, "the first run ended before the second was refused"
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 2, err2
    assert f"ctxprec: error: output folder {out} is being written by pid {first.pid}" in err2
    assert "since " in err2
    assert "--wait-lock" in err2
    assert "Traceback" not in err2
    items = slow_judge.stats.items
    assert len(items) == 2 * ROWS
    assert max(items.values()) == 1
    assert pl.read_parquet(out / "*.parquet").height == ROWS
    assert not (out / "_ctxprec" / "lock").exists()  # released at the end


def test_second_run_with_wait_lock_waits_then_pays_nothing(
    tmp_path: Path, slow_judge: FakeJudgeServer
) -> None:
    src, out = source(tmp_path), tmp_path / "out"
    first = start(src, out)
    wait_for_lock(out, first)
    second = start(src, out, "--wait-lock", "3600")
    _, err1 = first.communicate(timeout=300)
    calls_of_first = slow_judge.stats.total
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert "is locked by pid" in err2
    assert "waiting up to 3600 s" in err2
    assert slow_judge.stats.total == calls_of_first == 2 * ROWS  # the second made 0 calls
    assert '"rows_this_run": 0' in out2
    assert max(slow_judge.stats.items.values()) == 1
