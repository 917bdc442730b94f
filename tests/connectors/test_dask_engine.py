"""`--engine dask` on a real local Dask cluster (2 worker processes) against the fake judge in its
own process: same output as the local engine, one rate limit for the cluster, a killed worker,
a restart on "other machines" (a fresh memo) that repeats no finished call, a failing task.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import polars as pl
import pyarrow.parquet as pq
import pytest

import ctxprec.engines.dask as engine
import ctxprec.engines.keyed as keyed
from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.engines.dask import plan_tasks
from ctxprec.flow.audit import audited
from ctxprec.limits.limiter import RateThrottle
from ctxprec.run.driver import RunOptions, StageResult, prepare_run
from ctxprec.run.stage import run_stage
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.outdir.keyshards import read_answers, read_requests, request_files, shard_of
from tests.fakes.inputs import HOTPOT_MAP
from tests.fakes.judge_server import expected_verdict
from tests.fakes.runs import fake_stats, judge_process

pytestmark = pytest.mark.slow  # a local Dask cluster of worker processes

if TYPE_CHECKING:
    from distributed import Client

COLUMNS = ["id", "score", "status", "verdicts", "verdict_reasons", "relevant_count",
           "paid_input_tokens", "verdict_input_tokens"]  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        ) as local,
        distributed.Client(local) as client,
    ):
        yield client


@pytest.fixture
def server() -> Iterator[str]:
    with judge_process("--latency-ms", "20") as url:
        yield url


def split(hotpot: Path, folder: Path, files: int, rows: int, start: int = 0) -> Path:
    folder.mkdir()
    frame = pl.read_parquet(hotpot)
    for i in range(files):
        frame.slice(start + i * rows, rows).write_parquet(folder / f"part{i}.parquet")
    return folder


def score(
    src: Path,
    out: Path,
    url: str,
    cache: Path,
    *flags: object,
    cluster: Client | None = None,
    seams: Seams = DEFAULT,
) -> int:
    engine = ["--engine", "dask", "--scheduler", cluster.scheduler.address] if cluster else []
    judge = ["--model", "openai/judge", "--base-url", url]
    args = ["score", src, "-o", out, *judge, *HOTPOT_MAP, "--cache-dir", cache]
    return main([*map(str, args), "--progress", "off", *engine, *map(str, flags)], seams=seams)


def table(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "**/*.parquet").select(COLUMNS).sort("id")


def run_json(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "_ctxprec" / "run.json").read_text())
    return data


def test_same_output_and_summary_as_the_local_engine(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str
) -> None:
    src = split(hotpot, tmp_path / "in", files=3, rows=50)
    flags = ("--batch-rows", 10)
    assert score(src, tmp_path / "local", server, tmp_path / "c1", *flags) == 0
    assert score(src, tmp_path / "dask", server, tmp_path / "c2", *flags, cluster=cluster) == 0
    local, dask = table(tmp_path / "local"), table(tmp_path / "dask")
    assert dask.height == 150
    assert dask.get_column("id").is_unique().all()
    assert dask.equals(local)
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("local", "dask")]
    for key in ("rows", "score", "failures", "rank_metrics", "parts"):
        assert summaries[0][key] == summaries[1][key], key
    runs = [run_json(tmp_path / d) for d in ("local", "dask")]
    for key in ("rows_this_run", "items_this_run", "judge_calls", "memo_hits", "calls_failed"):
        assert runs[0][key] == runs[1][key], key
    assert runs[0].keys() == runs[1].keys()
    assert runs[1]["engine"] == {"name": "dask", "workers": 2, "tasks": 3, "shards": 4}
    assert (tmp_path / "dask" / "_SUCCESS").exists()


def test_a_pair_repeated_across_files_is_judged_once_for_the_cluster(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str
) -> None:
    """The same rows (under other ids) in three files, two workers: each distinct (query,
    item) pair is one judge call, as with the local engine; the rest is de-duplication."""
    src = tmp_path / "in"
    src.mkdir()
    rows = pl.read_parquet(hotpot).head(20)
    for i in range(3):
        copy = rows.with_columns(pl.format("f{}-{}", pl.lit(i), pl.col("id")).alias("id"))
        copy.write_parquet(src / f"day{i}.parquet")
    out = tmp_path / "out"
    assert score(src, out, server, tmp_path / "c", "--batch-rows", 5, cluster=cluster) == 0
    distinct = rows.explode("contexts").select("question", "ground_truth", "contexts").n_unique()
    items = 3 * rows.get_column("contexts").list.len().sum()
    run = run_json(out)
    assert fake_stats(server)["total"] == run["judge_calls"] == distinct
    assert run["dedup_hits"] == items - distinct
    assert run["memo_hits"] == 0
    assert table(out).height == 60
    assert not (out / "_ctxprec" / "shuffle").exists()  # the run's scratch is gone
    before = fake_stats(server)["total"]  # with the memo off: still once, nothing kept
    args = ("--batch-rows", 5, "--no-memo")
    assert score(src, tmp_path / "out2", server, tmp_path / "c", *args, cluster=cluster) == 0
    assert fake_stats(server)["total"] - before == distinct
    assert not (tmp_path / "out2" / "_ctxprec" / "verdicts").exists()


def test_one_request_rate_for_the_whole_cluster(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str
) -> None:
    rpm = 2400  # 40 a second, for about 6 s
    src = split(hotpot, tmp_path / "in", files=2, rows=12)
    out = tmp_path / "out"
    assert score(src, out, server, tmp_path / "c", "--rpm", rpm, cluster=cluster) == 0
    got = fake_stats(server)
    per_second = rpm / 60
    windows = [got["per_second"][k] for k in sorted(got["per_second"], key=int)]
    assert got["total"] == run_json(out)["judge_calls"] > 200
    assert max(windows) <= per_second + 2  # both workers together, not each
    full = windows[:-1]  # the last second is a part of one
    assert sum(full) / len(full) > 0.9 * per_second  # and the limit is used
    engine = run_json(out)["engine"]
    assert engine["permits"] == got["total"]
    assert engine["leases"] < got["total"] / 4  # start times leased in blocks


def test_a_killed_worker_loses_nothing_and_duplicates_nothing(
    cluster: Client, hotpot: Path, tmp_path: Path
) -> None:
    with judge_process("--latency-ms", "30") as url:
        src = split(hotpot, tmp_path / "in", files=4, rows=30)
        out = tmp_path / "out"
        codes: list[int] = []
        flags = ("--batch-rows", 10, "--concurrency", 4)
        run = threading.Thread(
            target=lambda: codes.append(
                score(src, out, url, tmp_path / "c", *flags, cluster=cluster)
            )
        )
        run.start()
        parts = out / "_ctxprec" / "parts"
        deadline = time.monotonic() + 30
        while len(list(parts.glob("*.json"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        busy = [w for w, keys in cluster.processing().items() if keys]
        assert busy
        assert not (out / "_SUCCESS").exists()
        pids = cluster.run(os.getpid, workers=busy[:1])
        os.kill(next(iter(pids.values())), signal.SIGKILL)
        run.join(60)
        calls = fake_stats(url)["total"]
    assert codes == [0]
    assert not list(out.rglob(".ctxprec-tmp-*"))  # the dead worker's half-written file is gone
    done = pl.read_parquet(out / "*.parquet")
    assert done.height == 120
    assert done.get_column("id").is_unique().all()
    source = pl.read_parquet(src / "*.parquet").select("id", "contexts")
    for row in done.join(source, on="id").iter_rows(named=True):
        assert row["verdicts"] == [expected_verdict(item) for item in row["contexts"]]
    unique = sum(  # what the four tasks call without a kill (each de-duplicates its file)
        pl.read_parquet(f).explode("contexts").select(["question", "ground_truth", "contexts"])
        .n_unique()
        for f in src.glob("*.parquet")
    )  # fmt: skip
    assert unique <= calls <= unique + 40  # only the dead worker's calls in flight were repeated


def test_restart_elsewhere_repeats_no_finished_judge_call(
    cluster: Client, hotpot: Path, tmp_path: Path
) -> None:
    """A run where 10% of calls fail, then the same command with a fresh memo (other machines):
    only the failed calls go to the judge again; the verdicts come from OUTDIR."""
    with judge_process("--latency-ms", "10", "--p-500", "0.1", "--seed", "7") as url:
        src = split(hotpot, tmp_path / "in", files=3, rows=30)
        out = tmp_path / "out"
        flags = ("--batch-rows", 10, "--max-retries", 0)
        assert score(src, out, url, tmp_path / "c1", *flags, cluster=cluster) == 1
        first = run_json(out)
        before = fake_stats(url)["total"]
        assert first["calls_failed"] > 0
        assert score(src, out, url, tmp_path / "c2", *flags, cluster=cluster) in (0, 1)
        again = fake_stats(url)["total"] - before
    second = run_json(out)
    assert again == second["judge_calls"] == first["calls_failed"]
    assert second["memo_hits"] > 0
    assert table(out).get_column("id").is_unique().all()
    assert table(out).height == 90


def corrupt_second_row_group(hotpot: Path, path: Path) -> None:
    table = pl.read_parquet(hotpot).slice(400, 40).to_arrow()
    pq.write_table(table, path, row_group_size=20, compression="snappy")
    good = path.read_bytes()
    column = table.schema.get_field_index("contexts")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    end = start + chunk.total_compressed_size
    path.write_bytes(good[: start + 10] + b"\x13" * (end - start - 10) + good[end:])


def test_a_failing_task_keeps_the_other_tasks_output(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = split(hotpot, tmp_path / "in", files=2, rows=30)
    corrupt_second_row_group(hotpot, src / "part2.parquet")
    out = tmp_path / "out"
    assert score(src, out, server, tmp_path / "c", "--batch-rows", 10, cluster=cluster) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err
    assert "part2.parquet after row 20" in err
    assert "Traceback" not in err
    kept = pl.read_parquet(out / "*.parquet")
    assert kept.height == 80  # both good files, and the rows before the corrupt page
    assert not (out / "_SUCCESS").exists()


def test_without_dask_installed_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    src = tmp_path / "in.parquet"
    pl.DataFrame({"id": [1], "query": ["q"], "contexts": [["c"]]}).write_parquet(src)
    assert main(["score", str(src), "-o", str(tmp_path / "out"), "--engine", "dask"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'ctxprec[dask]'" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert main(["score", str(src), "-o", str(tmp_path / "out"), "--workers", "2"]) == 2
    assert "--engine dask" in capsys.readouterr().err


def test_slices_of_a_big_file_cover_it_once(hotpot: Path, tmp_path: Path, server: str) -> None:
    """The engine's tasks, run here one after another: a file cut into slices is scored once,
    and a slice run again (its worker died after committing) reads its parts past."""
    src = tmp_path / "big.parquet"
    pl.read_parquet(hotpot).head(60).write_parquet(src)
    flags = {"judge.model": "openai/judge", "judge.base_url": server, "run.batch_rows": 10}
    flags |= {"columns.query": "question", "columns.expected": "ground_truth"}
    cfg = load_config(None, flags | {"run.cache_dir": str(tmp_path / "c")})

    async def tasks() -> tuple[list[StageResult], StageResult]:
        plan = await prepare_run(str(src), tmp_path / "out", cfg)
        slices = plan_tasks(plan, task_rows=20)
        assert [(t.first, t.stop) for t in slices] == [(0, 2), (2, 4), (4, 6)]
        results = [await run_stage(plan, files=[t.file], skip=t.skip()) for t in slices]
        again = await run_stage(plan, files=[0], skip=slices[1].skip())
        return results, again

    results, again = anyio.run(tasks)
    assert [r.counters.rows_done for r in results] == [20, 20, 20]
    assert again.counters.rows_done == 20
    assert again.counters.judge_calls == 0
    done = pl.read_parquet(tmp_path / "out" / "*.parquet")
    assert done.height == 60
    assert done.get_column("id").is_unique().all()


def test_the_driver_holds_the_output_lock_for_the_whole_cluster_run(
    cluster: Client,
    hotpot: Path,
    tmp_path: Path,
    server: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ctxprec.storage.outdir.lock import OutdirLock, live_holder

    src, out = split(hotpot, tmp_path / "in", files=2, rows=10), tmp_path / "out"
    other = OutdirLock(out)
    other.acquire()  # another run holds the folder: refused before any judge call
    try:
        assert score(src, out, server, tmp_path / "c", cluster=cluster) == 2
    finally:
        other.release()
    assert "is being written by pid" in capsys.readouterr().err
    assert fake_stats(server)["total"] == 0
    seen = []

    def watching(point: str, subject: Any) -> None:
        if point == "tasks":  # the tasks are about to go to the cluster
            seen.append(live_holder(out))

    seams = Seams(fault=watching)
    assert score(src, out, server, tmp_path / "c", cluster=cluster, seams=seams) == 0
    assert len(seen) == 1
    assert seen[0] is not None
    assert seen[0].pid == os.getpid()
    assert live_holder(out) is None
    assert not (out / "_ctxprec" / "lock").exists()


def test_a_refused_run_exits_4_on_the_cluster_too(
    cluster: Client, hotpot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 401 on the workers is the judge refusing the run: exit 4 with its cause, not exit 3."""
    with judge_process("--require-key", "another-key") as url:
        src = split(hotpot, tmp_path / "in", files=2, rows=10)
        assert score(src, tmp_path / "out", url, tmp_path / "c1", cluster=cluster) == 4
    err = capsys.readouterr().err
    assert "the judge refused the run" in err
    assert "API key was refused" in err


def test_a_slice_plans_each_key_once_in_parts(hotpot: Path, tmp_path: Path, server: str) -> None:
    """A planning task writes its requests out in parts (its memory holds keys, not texts);
    across parts and shards each distinct key of the slice appears once."""
    src = tmp_path / "in.parquet"
    rows = pl.read_parquet(hotpot).head(20)
    pl.concat([rows, rows]).with_row_index("n").with_columns(
        pl.format("{}-{}", pl.col("id"), pl.col("n")).alias("id")
    ).drop("n").write_parquet(src)
    flags = {"judge.model": "openai/judge", "judge.base_url": server, "run.batch_rows": 5}
    flags |= {"columns.query": "question", "columns.expected": "ground_truth"}
    cfg = load_config(None, flags | {"run.cache_dir": str(tmp_path / "c")})
    options = RunOptions(seams=Seams(plan_part_chars=1))  # a part after every batch
    plan = anyio.run(prepare_run, str(src), tmp_path / "out", cfg, options)
    scratch = tmp_path / "scratch"
    distinct = keyed.plan_slice(plan, 0, frozenset(), 0, scratch, 4)
    found = []
    for shard in range(4):
        files = request_files(scratch, shard)
        assert len(files) > 1
        found += [r[0] for path in files for r in read_requests(path)]
        assert all(shard_of(k, 4) == shard for path in files for k, *_ in read_requests(path))
    unique = rows.explode("contexts").select("question", "ground_truth", "contexts").n_unique()
    assert distinct == len(found) == len(set(found)) == unique

    async def judge_all() -> list[StageResult]:
        throttles = [RateThrottle(4, None, None) for _ in range(4)]
        return [await keyed.judge_shard(plan, s, scratch, 4, throttles[s]) for s in range(4)]

    judged = anyio.run(judge_all)
    assert sum(r.counters.judge_calls for r in judged) == unique
    answers = {key: entry for key, entry, fresh, _ in read_answers(scratch, 0) if fresh}
    assert set(answers) == set(found)  # every part's keys answered, not just the last part's


def test_the_coordinator_paces_just_under_the_limit() -> None:
    """Starts 1% under --rpm: the jitter between workers cannot make a minute one over."""

    class Scheduler:
        def __init__(self) -> None:
            self.handlers: dict[str, Any] = {}

    scheduler = Scheduler()
    engine._install("run1", 1200, None, False, dask_scheduler=scheduler)

    async def lease() -> dict[str, Any]:
        reply: dict[str, Any] = await scheduler.handlers[engine._op("run1")](
            ests=[1] * 10, debt=0, reports=[]
        )
        return reply

    offsets = anyio.run(lease)["offsets"]
    assert engine._uninstall("run1", dask_scheduler=scheduler)["permits"] == 10
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    spacing = 60 / (1200 * (1 - engine.RPM_GUARD))
    # The first start is measured on the real clock, so it carries the microseconds the
    # lease itself took; every later start is spaced on the schedule alone.
    assert gaps[0] == pytest.approx(spacing, abs=spacing * engine.RPM_GUARD / 4)
    assert gaps[1:] == pytest.approx([spacing] * 8, rel=1e-3)
    assert engine.RPM_GUARD > 0


def test_verdict_only_on_the_cluster_equals_the_local_engine(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str
) -> None:
    """`--verdict-only` on Dask: the same verdicts, no per-item reasons, its own memo entries
    (a reasoned memo of the same items is not reused), as the local engine."""
    src = split(hotpot, tmp_path / "in", files=2, rows=20)
    flags = ("--batch-rows", 10, "--verdict-only")
    assert score(src, tmp_path / "reasoned", server, tmp_path / "c2", cluster=cluster) == 0
    assert score(src, tmp_path / "local", server, tmp_path / "c1", *flags) == 0
    calls = fake_stats(server)["total"]
    assert score(src, tmp_path / "dask", server, tmp_path / "c2", *flags, cluster=cluster) == 0
    local, dask = table(tmp_path / "local"), table(tmp_path / "dask")
    assert dask.equals(local)
    assert all(r == [""] * len(r) for r in dask.get_column("verdict_reasons").to_list())
    assert run_json(tmp_path / "dask")["judge_calls"] == run_json(tmp_path / "local")["judge_calls"]
    assert fake_stats(server)["total"] - calls == run_json(tmp_path / "local")["judge_calls"]
    versions = pl.read_parquet(tmp_path / "dask" / "**/*.parquet").get_column("prompt_version")
    assert set(versions) == {"cp-item-vo-v1"}


@pytest.mark.parametrize("mode", ["item", "row"])
def test_the_audit_judge_on_the_cluster_equals_the_local_engine(
    cluster: Client, hotpot: Path, tmp_path: Path, server: str, mode: str
) -> None:
    """`--audit-model` on the cluster: the same audit columns, corrected estimate,
    agreement and audit calls as the local engine; a re-run with the same memo calls neither
    judge. Item by item, the same rows under other ids in two files: an item sampled in both is
    one audit call for the cluster (the audit sample's own key shuffle), as on the local engine."""
    if mode == "item":
        src = tmp_path / "in"
        src.mkdir()
        rows = pl.read_parquet(hotpot).head(20)
        for i in range(2):
            copy = rows.with_columns(pl.format("f{}-{}", pl.lit(i), pl.col("id")).alias("id"))
            copy.write_parquet(src / f"day{i}.parquet")
    else:  # a call judges a whole row: de-duplication stays within a task, for both judges
        src = split(hotpot, tmp_path / "in", files=2, rows=20)
    with judge_process("--latency-ms", "5", "--flip-share", "0.3") as strong:
        flags = ("--batch-rows", 10, "--mode", mode, "--audit-model", "openai/strong",
                 "--audit-base-url", strong, "--audit-fraction", 0.6)  # fmt: skip
        assert score(src, tmp_path / "local", server, tmp_path / "c1", *flags) == 0
        local_calls = fake_stats(strong)["total"]
        assert score(src, tmp_path / "dask", server, tmp_path / "c2", *flags, cluster=cluster) == 0
        dask_calls = fake_stats(strong)["total"] - local_calls
        again = tmp_path / "again"
        assert score(src, again, server, tmp_path / "c2", *flags, cluster=cluster) == 0
        assert fake_stats(strong)["total"] == local_calls + dask_calls  # the memo holds them all
    frame = pl.concat([pl.read_parquet(f) for f in sorted(src.glob("*.parquet"))])
    sampled = frame.filter(pl.col("id").map_elements(lambda i: audited(i, 0.6, 0), pl.Boolean))
    pairs = sampled.explode("contexts").select("question", "ground_truth", "contexts")
    if mode == "item":  # each distinct sampled pair once, though some are in both files
        assert dask_calls == pairs.n_unique() < pairs.height
        assert local_calls >= dask_calls  # (the local engine may race on a repeated pair)
    else:
        assert dask_calls == local_calls > 0
    audit_cols = ["id", "audit_verdicts", "audit_score"]
    local, dask = (pl.read_parquet(tmp_path / d / "**/*.parquet").select(audit_cols).sort("id")
                   for d in ("local", "dask"))  # fmt: skip
    assert local.get_column("audit_score").is_not_null().sum() == sampled.height
    assert dask.equals(local)
    s = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("local", "dask", again)]
    assert s[1]["estimates"] == s[0]["estimates"] == s[2]["estimates"]
    assert s[1]["estimate"]["reference"] == "audit:openai/strong"
    assert s[1]["audit"]["agreement"] == s[0]["audit"]["agreement"]
    assert s[1]["audit"]["rows"] == s[0]["audit"]["rows"] == sampled.height
    judges = [x["audit"]["judges"] for x in s]
    assert judges[1]["audit"]["calls"] == dask_calls
    assert judges[0]["audit"]["calls"] == local_calls
    assert judges[2]["audit"]["calls"] == judges[2]["judge"]["calls"] == 0
    audits = [run_json(tmp_path / d)["audit"] for d in ("local", "dask")]
    for key in ("rows_this_run", "items_this_run", "calls_failed"):
        assert audits[1][key] == audits[0][key], key
    assert audits[1]["judge_calls"] == dask_calls
