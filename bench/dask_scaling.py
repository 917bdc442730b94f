"""`--engine dask` on this machine: scaling, the cluster-wide rate limit, and lease throughput.

(a) scaling: the same input (FILES Parquet files, 10 unique items a row) scored against a 100 ms
    loopback judge by the local engine, then by a local Dask cluster of 1 and of 2 workers
    (`--concurrency` calls in flight per task), and by 2 workers with an --rpm far above what they
    reach (the lease overhead when the limit does not bind). Figures: rows/s of the run (run.json
    wall, cluster start-up included) and judge calls/s at the server (first to last request).
(b) rate: 2 workers with `--rpm R`: requests per second at the server (its own timestamps, whole
    seconds) against R/60, the busiest 10 s against R/6, lease calls and permits per lease.
(c) leases: calls/s through the scheduler to one coordinator, 2 workers each leasing in a loop,
    one permit per call (what a central call per request would cost) and blocks of 50.

The clusters are started here (not by ctxprec) and passed with --scheduler.
Usage: python bench/dask_scaling.py [--quick] [--rows 1000] [--rpm 3000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
from _common import (
    CpuAudit,
    check_ok,
    child_env,
    ctxprec_cmd,
    fake_server,
    load_line,
    make_dataset,
    print_block,
    run_measured,
    workdir,
    write_result,
)
from distributed import Client, LocalCluster

from ctxprec.engines.dask import install_coordinator, remove_coordinator, scheduler_lease

FILES = 4
LATENCY_MS = 100


def split_input(folder: Path, rows: int) -> Path:
    source = make_dataset(folder / "all.parquet", rows)
    data = folder / "in"
    data.mkdir()
    frame = pl.read_parquet(source)
    per_file = -(-rows // FILES)
    for i in range(FILES):
        frame.slice(i * per_file, per_file).write_parquet(data / f"part{i}.parquet")
    source.unlink()
    return data


def score(
    data: Path, work: Path, name: str, url: str, extra: list[str], scheduler: str | None
) -> dict[str, Any]:
    """One `ctxprec score` run; its run.json and the server's view of it."""
    engine = ["--engine", "dask", "--scheduler", scheduler] if scheduler else []
    flags = ["--model", "openai/bench", "--base-url", url, "--cache-dir", str(work / f"c-{name}")]
    m = run_measured(
        ctxprec_cmd(data, work / name, *flags, "--batch-rows", "50", *extra, *engine),
        env=child_env(),
    )
    check_ok(m, name)
    run: dict[str, Any] = json.loads((work / name / "_ctxprec" / "run.json").read_text())
    return {"wall_s": m.wall_s, "run": run}


def server_view(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Requests of one run: per whole second since the server's first request."""
    old = {int(k): v for k, v in before.get("per_second", {}).items()}
    seconds = {int(k): v - old.get(int(k), 0) for k, v in after["per_second"].items()}
    busy = sorted(k for k, v in seconds.items() if v > 0)
    series = [seconds.get(k, 0) for k in range(busy[0], busy[-1] + 1)]
    return {"calls": after["total"] - before.get("total", 0), "per_second": series}


def scaling(args: argparse.Namespace, data: Path, work: Path, url: str, stats: Any) -> list[Any]:
    runs = [("local", 0, []), ("dask x1", 1, []), ("dask x2", 2, [])]
    runs.append(("dask x2, --rpm 1e6", 2, ["--rpm", "1000000"]))
    results = []
    for name, workers, extra in runs:
        extra = [*extra, "--concurrency", str(args.concurrency)]
        before = stats()
        tag = name.replace(" ", "").replace(",", "-")
        if workers:
            with cluster(workers) as address:
                got = score(data, work, tag, url, extra, address)
        else:
            got = score(data, work, tag, url, extra, None)
        view = server_view(before, stats())
        series = view["per_second"]
        full = series[1:-1] or series  # whole seconds only
        run = got["run"]
        results.append(
            {
                "name": name,
                "workers": workers,
                "rows": run["rows_this_run"],
                "calls": view["calls"],
                "run_wall_s": run["wall_s"],
                "rows_per_s": run["rows_this_run"] / run["wall_s"],
                "calls_per_s": sum(full) / len(full),
                "engine": run["engine"],
            }
        )
        r = results[-1]
        print(
            f"  {name:20} {r['rows_per_s']:7.1f} rows/s  {r['calls_per_s']:7.1f} calls/s  "
            f"(run {r['run_wall_s']:.1f} s, {r['calls']} calls)",
            flush=True,
        )
    return results


def rate(args: argparse.Namespace, data: Path, work: Path, url: str, stats: Any) -> dict[str, Any]:
    before = stats()
    with cluster(2) as address:
        got = score(data, work, "rate", url, ["--rpm", str(args.rpm)], address)
    view = server_view(before, stats())
    series = view["per_second"]
    full = series[1:-1]
    per_second = args.rpm / 60
    ten = max(sum(series[i : i + 10]) for i in range(max(1, len(series) - 9)))
    engine = got["run"]["engine"]
    return {
        "rpm": args.rpm,
        "limit_per_s": per_second,
        "calls": view["calls"],
        "seconds": len(series),
        "max_per_s": max(series),
        "mean_per_s": sum(full) / len(full),
        "busiest_10s": ten,
        "limit_10s": args.rpm / 6,
        "leases": engine.get("leases"),
        "permits": engine.get("permits"),
        "permits_per_lease": engine["permits"] / max(engine["leases"], 1),
    }


def _hammer(run_id: str, block: int, seconds: float) -> tuple[int, float]:
    """On a worker: lease `block` permits at a time, one lease after another."""
    lease = scheduler_lease(run_id)

    async def loop() -> tuple[int, float]:
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            await lease([1] * block, 0, [])
            calls += 1
        return calls, time.perf_counter() - started

    return asyncio.run(loop())


def leases(seconds: float) -> list[dict[str, Any]]:
    results = []
    with cluster(2) as address, Client(address) as client:
        for block in (1, 50):
            run_id = uuid.uuid4().hex[:12]
            install_coordinator(client, run_id, 1e12, None, False)
            futures = [
                client.submit(_hammer, run_id, block, seconds, pure=False, workers=[w])
                for w in client.scheduler_info()["workers"]
            ]
            done = client.gather(futures)
            remove_coordinator(client, run_id)
            calls = sum(c for c, _ in done)
            wall = max(w for _, w in done)
            results.append(
                {"block": block, "calls_per_s": calls / wall, "permits_per_s": block * calls / wall}
            )
    return results


@contextlib.contextmanager
def cluster(n: int) -> Iterator[str]:
    """A LocalCluster of `n` single-thread worker processes; yields its address."""
    with LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
    ) as local:
        yield local.scheduler_address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a quarter of the rows")
    parser.add_argument("--rows", type=int, default=1000, help="rows in all (10 items each)")
    parser.add_argument("--rpm", type=float, default=3000)
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight per task")
    parser.add_argument("--keep", type=Path, help="keep inputs and outputs in this folder")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    rows = args.rows // 4 if args.quick else args.rows
    with workdir(args.keep) as work, fake_server("--latency-ms", str(LATENCY_MS)) as server:
        data = split_input(work, rows)
        print(f"input: {rows} rows x 10 items in {FILES} files; judge {LATENCY_MS} ms a call")
        scaled = scaling(args, data, work, server.url, server.stats)
        rated = rate(args, split_input(work / "r", rows // 4), work, server.url, server.stats)
        leased = leases(2.0 if args.quick else 4.0)
    base = scaled[1]
    lines = [
        f"{r['name']:20} {r['rows_per_s']:7.1f} rows/s {r['calls_per_s']:7.1f} calls/s "
        f"({r['calls_per_s'] / base['calls_per_s']:.2f}x dask x1)"
        for r in scaled
    ]
    lines += [
        f"--rpm {rated['rpm']:.0f} on 2 workers: max {rated['max_per_s']}/s, mean "
        f"{rated['mean_per_s']:.1f}/s (limit {rated['limit_per_s']:.1f}/s); busiest 10 s "
        f"{rated['busiest_10s']} (limit {rated['limit_10s']:.0f}); {rated['leases']} leases for "
        f"{rated['permits']} permits ({rated['permits_per_lease']:.1f} a lease)",
    ]
    lines += [
        f"leases of {x['block']:>2}: {x['calls_per_s']:7.0f} calls/s, {x['permits_per_s']:8.0f} "
        "permits/s through the scheduler (2 workers)"
        for x in leased
    ]
    print_block("dask scaling", [*lines, load_line(audit)])
    write_result(
        "dask_scaling",
        {**audit.as_dict(), "quick": args.quick, "rows": rows, "latency_ms": LATENCY_MS,
         "scaling": scaled, "rate": rated, "leases": leased},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
