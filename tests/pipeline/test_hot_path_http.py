"""The HTTP judge's hot path: a budget of Python steps per judge call keeps the client's work per
call (request building, the post, reading and parsing the reply, the throttle, the dispatcher) from
growing again (docs/performance.md, "The hot-path guard"). No wall-clock assert: steps, unlike
seconds, do not depend on the machine or its load."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ctxprec.cli import main as cli
from ctxprec.cli.main import main
from ctxprec.storage.core.seams import DEFAULT, Seams
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeThread
from tests.pipeline.test_hot_path import counted_steps, write_fixed_input

# Steps = Python lines executed plus builtin calls made, in every thread of a real `ctxprec
# score` process against the loopback fake judge (no latency), aiohttp's own code included: that
# is what a call costs the client. Marginal figure: the steps of a 48-row run minus those of a
# 12-row run, per extra call (10 items a row, one call each, --no-memo), so start-up cancels out;
# the modules a run imports are imported before the hooks, and the summary and its charts (once
# per run, though their work follows the data) are not counted. At 4 calls in flight repeated
# runs agree to about 1.5 % (one tree measured 1,727-1,752). Measured 2026-12-03 (aiohttp 3.14,
# CPython 3.11), three interleaved runs each: 1,727-1,752 steps a call on main before the budget
# got its headroom (it was 1,880, +10 %, and code had been written inline to save steps and
# coroutine levels: post_json's attempt in its retry loop, the dispatcher's judging in its worker
# loop, the token estimate copied into the call path); 1,739-1,757 with that code in named helpers
# (`HttpClient._attempt` and `_send`, `Dispatcher._judge` and `_taken`, `OpenAIJudge._chat`,
# `estimate_tokens`). Older figures: 1,906 before the per-call work of branch http2, 2,344 on
# main before the issue-27 HTTP work; the bare aiohttp loop of bench/bare_client.py, counted the
# same way: 1,390 (it has no throttle, retries, dispatcher, memo keys, estimate or output rows).
BUDGET = 2_180  # the figure (~1,745) +25 %: room for clear code; change only as docs say

_MODULES = (
    *("aiohttp", "anyio", "ctxprec.cli.commands", "ctxprec.engines.local", "ctxprec.run.stage"),
    *(
        "ctxprec.flow.planning",
        "ctxprec.connectors.judges.openai",
        "ctxprec.storage.report.summary",
    ),
)


def steps_per_call(work: Path, root: Path = REPO) -> float:
    """Marginal Python steps per judge call of `ctxprec score` (code under `root`)."""
    small, large = 12, 48
    counts: dict[int, int] = {}
    with FakeJudgeThread() as server:
        for rows in (small, large):
            data = write_fixed_input(work / f"in-{rows}.parquet", rows)
            argv = ["score", str(data), "-o", str(work / f"out-{rows}"), "--model", "openai/fake"]
            argv += ["--no-memo", "--concurrency", "4", "--progress", "off", "--quiet"]
            env = {"OPENAI_BASE_URL": server.url, "NO_PROXY": "127.0.0.1"}
            counts[rows] = counted_steps(root, argv, _MODULES, env)
    return (counts[large] - counts[small]) / ((large - small) * 10)


@pytest.mark.slow
def test_http_judge_call_stays_within_its_step_budget(tmp_path: Path) -> None:
    """A change that adds work to every HTTP judge call fails here; see docs/performance.md
    for what this guards and how to change BUDGET honestly."""
    got = steps_per_call(tmp_path)
    assert got <= BUDGET, f"{got:.0f} steps per judge call, over the budget of {BUDGET}"


def test_a_score_run_tunes_the_collector_and_gives_it_back(tmp_path: Path) -> None:
    """During a score run the objects imported before it are frozen out of the collector's
    passes and young collections are rarer; afterwards gc is as it was."""
    before = (gc.get_threshold(), gc.get_freeze_count())
    seen: list[tuple[tuple[int, int, int], int]] = []

    def watch(point: str, _: object) -> None:  # the collector as the run commits its part
        if point == "commit":
            seen.append((gc.get_threshold(), gc.get_freeze_count()))

    data = write_fixed_input(tmp_path / "in.parquet", 3)
    argv = ["score", str(data), "-o", str(tmp_path / "out"), "--progress", "off"]
    argv += ["--cache-dir", str(tmp_path / "memo"), "--quiet"]
    assert main(argv, seams=Seams(fault=watch)) == 0
    assert len(seen) == 1
    threshold, frozen = seen[0]
    assert threshold == (100_000, *before[0][1:])
    assert frozen > before[1]
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


if __name__ == "__main__":  # print the figure: python -m tests.pipeline.test_hot_path_http [ROOT]
    with tempfile.TemporaryDirectory() as tmp:
        code_root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
        print(json.dumps({"steps_per_call": steps_per_call(Path(tmp), code_root)}))


@pytest.mark.parametrize(("preset", "want"), [(None, "1"), ("2", "2")])
def test_a_command_runs_with_one_openblas_thread_unless_the_user_said(
    preset: str | None, want: str
) -> None:
    """NumPy's OpenBLAS threads busy-wait after loading (~0.1 s of CPU a process on two
    cores); ctxprec needs none of them. A user's own OPENBLAS_NUM_THREADS is kept."""
    probe = (
        "import os\n"
        "from ctxprec.cli.main import main\n"
        "main(['providers'])\n"
        "import numpy\n"  # a command's modules import it after main set the variable
        "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    value, tasks = out.stdout.split()[-2:]
    assert value == want
    if sys.platform == "linux":
        assert int(tasks) == int(want)  # the main thread, plus OpenBLAS's extra ones if asked


def test_a_commands_modules_load_with_the_collector_paused_then_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading Polars, PyArrow, aiohttp and ctxprec's modules makes ~500,000 long-lived objects;
    collections during that walked them again. A command's module loads with the collector
    off, what exists is then frozen out of later passes, and the collector is on again after,
    also when the import fails."""
    (tmp_path / "ctxprec_gc_probe.py").write_text(
        "import gc\nENABLED = gc.isenabled()\ndef run(args, seams):\n    return 0\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    frozen = gc.get_freeze_count()
    try:
        assert gc.isenabled()
        assert cli._load_frozen("ctxprec_gc_probe").run(argparse.Namespace(), DEFAULT) == 0
        assert sys.modules["ctxprec_gc_probe"].ENABLED is False  # off while it loaded
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen
        with pytest.raises(ImportError):
            cli._load_frozen("ctxprec_no_such_module")
        assert gc.isenabled()
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
        sys.modules.pop("ctxprec_gc_probe", None)
