"""A backfill on a Dask cluster of separate processes: ITEMS context items in FILES Parquet files
whose (query, item) pairs recur across files (several retrievers per query, a year of daily logs
repeating head queries), scored with `--engine dask` against the loopback judge (no latency).

Figures: judge calls/s per worker (the server's first to last request), requests ÷ distinct
(query, item) pairs of the whole input (1.00 = each pair judged once cluster-wide), wall time,
and peak RSS of the client (the `ctxprec` process) and of each worker process.

The cluster is started here (a LocalCluster of worker processes) and passed with --scheduler.
Usage: python bench/dask_backfill.py [--items 1000000] [--workers 2] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
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
    print_block,
    run_measured,
    workdir,
    write_result,
)
from distributed import Client, LocalCluster

FILES = 8
ITEMS_PER_ROW = 10
POOL = 20  # passages a query's retrievers draw from
PAIRS_PER_ITEM = 0.2  # distinct pairs ≈ this share of the items


def make_input(folder: Path, items: int) -> tuple[Path, int]:
    """The input folder and its number of distinct (query, item) pairs."""
    rows = -(-items // ITEMS_PER_ROW)
    queries = max(1, int(items * PAIRS_PER_ITEM / POOL))
    rng = random.Random(11)
    data = folder / "in"
    data.mkdir()
    per_file = -(-rows // FILES)
    for f in range(FILES):
        ids, qs, contexts = [], [], []
        for i in range(f * per_file, min(rows, (f + 1) * per_file)):
            q = rng.randrange(queries)
            ids.append(f"r{i}")
            qs.append(f"backfill query {q}: what is known about subject {q}?")
            picks = rng.sample(range(POOL), ITEMS_PER_ROW)
            contexts.append([f"passage {p} of subject {q}, with some words" for p in picks])
        frame = pl.DataFrame({"id": ids, "query": qs, "contexts": contexts})
        frame.write_parquet(data / f"day{f:03d}.parquet")
    distinct = (
        (pl.scan_parquet(data / "*.parquet").explode("contexts").select("query", "contexts"))
        .unique()
        .select(pl.len())
        .collect()
        .item()
    )
    return data, int(distinct)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1_000_000, help="context items in all")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight per task")
    parser.add_argument("--keep", type=Path, help="keep inputs and outputs in this folder")
    args = parser.parse_args(argv)
    audit = CpuAudit()
    with workdir(args.keep) as work, fake_server() as server:
        data, distinct = make_input(work, args.items)
        print(f"input: {args.items} items in {FILES} files, {distinct} distinct pairs", flush=True)
        with LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster:
            flags = ["--model", "openai/bench", "--base-url", server.url]
            flags += ["--cache-dir", str(work / "client-cache"), "--concurrency"]
            flags += [str(args.concurrency), "--engine", "dask"]
            flags += ["--scheduler", cluster.scheduler_address]
            m = run_measured(ctxprec_cmd(data, work / "out", *flags), env=child_env())
            check_ok(m, "dask backfill")
            with Client(cluster) as client:
                workers = list(client.run(_peak_rss_mib).values())
        stats = server.stats()
        run: dict[str, Any] = json.loads((work / "out" / "_ctxprec" / "run.json").read_text())
    seconds = {int(k): v for k, v in stats["per_second"].items()}
    span = max(seconds) - min(seconds) + 1 if seconds else 1
    requests = stats["total"]
    result = {
        "items": args.items,
        "files": FILES,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "distinct_pairs": distinct,
        "requests": requests,
        "requests_per_distinct": requests / max(distinct, 1),
        "judging_s": span,
        "calls_per_s_per_worker": requests / span / args.workers,
        "wall_s": m.wall_s,
        "client_peak_mib": m.maxrss_mib,
        "worker_peak_mib": workers,
        "engine": run.get("engine"),
    }
    lines = [
        f"{args.items:,} items, {distinct:,} distinct pairs, {args.workers} workers: "
        f"{requests:,} requests = {result['requests_per_distinct']:.3f} x distinct",
        f"judge calls/s per worker {result['calls_per_s_per_worker']:.0f} "
        f"({span} s of judging; run {m.wall_s:.0f} s)",
        f"peak RSS: client {m.maxrss_mib:.0f} MiB, workers "
        + ", ".join(f"{w:.0f}" for w in workers)
        + " MiB",
    ]
    print_block("dask backfill", [*lines, load_line(audit)])
    write_result("dask_backfill", {**audit.as_dict(), **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
