"""Cold and warm run speed: the same input scored twice with the offline judge and one memo folder.

Run 1 (cold) fills a fresh --cache-dir; run 2 (warm) writes a new OUTDIR with the same cache, so
every verdict is a memo hit. Figures: items/s of each run, from the subprocess's wall time (start-up
included) and from the run's own OUTDIR/_ctxprec/run.json (wall_s), plus its memo_hits; the
warm/cold speed-up; peak RSS. Each beside its reference, measured in the same run on a sample of
the same items: a plain diskcache `get` loop over their memo keys (the warm run's floor without
batching), a batched SQLite `SELECT key, value FROM Cache WHERE key IN (...)` of the same keys
on the same memo file (the floor with batching), and the offline judge alone, `decide` item by
item (the cold run's).
Goals (ratios): warm run ≥ 0.8× the batched SELECT, cold run ≥ 0.8× the judge alone,
both from the process's wall time, start-up included; the earlier absolute goals (warm ≥
100,000 items/s, cold ≥ 25,000 items/s at 1 M items) are kept beside them.

Usage: python bench/warm_rerun.py [--quick] [--rows 100000] [--item-chars N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    CpuAudit,
    check_ok,
    child_env,
    ctxprec_cmd,
    dataset_items,
    load_line,
    make_dataset,
    print_block,
    quiet_line,
    run_measured,
    verdict,
    workdir,
    write_result,
)

GOAL_ITEMS_PER_S = 100_000  # warm
GOAL_COLD_ITEMS_PER_S = 25_000
GOAL_WARM_OVER_SELECT = 0.8  # warm run ÷ the batched SELECT of the same keys
GOAL_COLD_OVER_JUDGE = 0.8  # cold run ÷ the offline judge alone
SELECT_CHUNK = 900  # keys per `IN (...)`: under SQLite's oldest limit of 999 variables
REFERENCE_SAMPLE = 200_000  # items the references time (their rate does not depend on the size)


def scored_run(data: Path, outdir: Path, cache: Path, items: int) -> dict[str, Any]:
    """One `ctxprec score --model offline --cache-dir CACHE`; process and run.json figures."""
    cmd = ctxprec_cmd(data, outdir, "--model", "offline", "--cache-dir", str(cache))
    m = run_measured(cmd, env=child_env(), timeout_s=3600)
    check_ok(m, "ctxprec score")
    run = json.loads((outdir / "_ctxprec" / "run.json").read_text(encoding="utf-8"))
    return {
        "items": items,
        "process_wall_s": m.wall_s,
        "items_per_s": items / m.wall_s,
        "run_wall_s": run["wall_s"],
        "run_items_per_s": items / run["wall_s"],
        "memo_hits": run["memo_hits"],
        "judge_calls": run["judge_calls"],
        "cpu_s": m.cpu_s,
        "maxrss_mib": m.maxrss_mib,
        "score_mean": quiet_line(m).get("score_mean"),
    }


def references(data: Path, cache: Path, limit: int) -> dict[str, Any]:
    """The references on the first `limit` items: a plain diskcache `get` loop over their memo
    keys (keys/s), a batched SQLite SELECT of the same keys (keys/s) and the offline judge alone
    (items/s), timed in this process."""
    import diskcache
    import pyarrow.parquet as pq

    from ctxprec.connectors.judges import JudgeStats, NullThrottle
    from ctxprec.connectors.judges.offline import OfflineJudge
    from ctxprec.connectors.judges.prompts import prompt_version_for
    from ctxprec.storage.core.settings import JudgeSettings
    from ctxprec.storage.memo.store import item_keys, judge_prefix, row_hasher

    table = pq.read_table(data, columns=["query", "expected_output", "contexts"])
    judge = OfflineJudge("default", JudgeSettings(), NullThrottle(), JudgeStats())
    prefix = judge_prefix(judge.identity())
    rows: list[tuple[str, str, list[str]]] = []
    n = 0
    for q, e, items in zip(*(table.column(i).to_pylist() for i in range(3)), strict=True):
        if n >= limit:
            break
        rows.append((q, e, items))
        n += len(items)
    keys = [
        k
        for q, e, items in rows
        for k in item_keys(row_hasher(prefix, prompt_version_for(e, False), q, e), items)
    ]
    cache_dir = cache
    cache = diskcache.Cache(str(cache_dir))
    try:
        started = time.perf_counter()
        hits = sum(1 for k in keys if cache.get(k) is not None)
        loop_s = time.perf_counter() - started
    finally:
        cache.close()
    select_s, selected = batched_select(cache_dir / "cache.db", keys)
    started = time.perf_counter()
    for q, e, items in rows:
        for item in items:
            judge.decide(q, e, item)
    judge_s = time.perf_counter() - started
    return {
        "items": n,
        "diskcache_hits": hits,
        "diskcache_keys_per_s": len(keys) / loop_s,
        "select_rows": selected,
        "select_keys_per_s": len(keys) / select_s,
        "judge_items_per_s": n / judge_s,
    }


def batched_select(db: Path, keys: list[str]) -> tuple[float, int]:
    """Seconds to fetch every key's stored value with `SELECT key, value ... WHERE key IN (...)`
    in chunks, on a read-only connection to the memo's SQLite file, and the rows it returned."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        started = time.perf_counter()
        got = 0
        for i in range(0, len(keys), SELECT_CHUNK):
            chunk = keys[i : i + SELECT_CHUNK]
            marks = ",".join("?" * len(chunk))
            got += len(
                con.execute(
                    f"SELECT key, value FROM Cache WHERE key IN ({marks})", chunk
                ).fetchall()
            )
        return time.perf_counter() - started, got
    finally:
        con.close()


def report(
    cold: dict[str, Any], warm: dict[str, Any], refs: dict[str, Any], rows: int
) -> list[str]:
    ok = warm["items_per_s"] >= GOAL_ITEMS_PER_S
    cold_ok = cold["items_per_s"] >= GOAL_COLD_ITEMS_PER_S
    over_select = warm["items_per_s"] / refs["select_keys_per_s"]
    over_judge = cold["items_per_s"] / refs["judge_items_per_s"]
    return [
        f"input: {rows:,} rows, {warm['items']:,} unique items; offline judge",
        f"cold run: {cold['items_per_s']:,.0f} items/s ({cold['process_wall_s']:.2f} s wall) "
        f"(goal ≥ {GOAL_COLD_ITEMS_PER_S:,}) {verdict(cold_ok)}; run.json: "
        f"{cold['run_items_per_s']:,.0f} items/s ({cold['run_wall_s']:.2f} s), "
        f"judge_calls {cold['judge_calls']:,}, memo_hits {cold['memo_hits']:,}",
        f"  reference, the offline judge alone ({refs['items']:,} items): "
        f"{refs['judge_items_per_s']:,.0f} items/s; cold run ÷ judge alone "
        f"{over_judge:.2f} (goal ≥ {GOAL_COLD_OVER_JUDGE}) "
        f"{verdict(over_judge >= GOAL_COLD_OVER_JUDGE)}",
        f"warm run: {warm['items_per_s']:,.0f} items/s ({warm['process_wall_s']:.2f} s wall) "
        f"(goal ≥ {GOAL_ITEMS_PER_S:,}) {verdict(ok)}",
        f"  run.json: {warm['run_items_per_s']:,.0f} items/s ({warm['run_wall_s']:.2f} s), "
        f"memo_hits {warm['memo_hits']:,}, judge_calls {warm['judge_calls']:,}",
        f"  reference, a plain diskcache get loop over the same keys: "
        f"{refs['diskcache_keys_per_s']:,.0f} keys/s; warm run ÷ that loop "
        f"{warm['items_per_s'] / refs['diskcache_keys_per_s']:.2f}",
        f"  reference, a batched SELECT of the same keys ({SELECT_CHUNK} per IN): "
        f"{refs['select_keys_per_s']:,.0f} keys/s; warm run ÷ that SELECT {over_select:.2f} "
        f"(goal ≥ {GOAL_WARM_OVER_SELECT}) {verdict(over_select >= GOAL_WARM_OVER_SELECT)}",
        f"warm/cold speed-up: {warm['items_per_s'] / cold['items_per_s']:.1f}x (process wall), "
        f"{warm['run_items_per_s'] / cold['run_items_per_s']:.1f}x (run.json)",
        f"CPU: cold {cold['cpu_s']:.1f} s, warm {warm['cpu_s']:.1f} s; peak RSS: cold "
        f"{cold['maxrss_mib']:.0f} MiB, warm {warm['maxrss_mib']:.0f} MiB",
        f"same mean score both runs: {cold['score_mean'] == warm['score_mean']}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows of 10 items each")
    parser.add_argument("--item-chars", type=int, help="fixed item length (default: HotpotQA's)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 rows")
    parser.add_argument("--workdir", type=Path, help="keep inputs/outputs here (default: temp)")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    rows = 2_000 if args.quick else args.rows
    with workdir(args.workdir) as work:
        data = make_dataset(work / f"rows-{rows}.parquet", rows, item_chars=args.item_chars)
        items = dataset_items(data)
        cache = work / "memo"
        cold = scored_run(data, work / "out-cold", cache, items)
        warm = scored_run(data, work / "out-warm", cache, items)
        refs = references(data, cache, REFERENCE_SAMPLE)
    if warm["memo_hits"] != items or warm["judge_calls"] != 0:
        raise SystemExit(f"warm run was not all memo hits: {warm}")
    print_block(
        "cold and warm run: offline judge, same memo",
        [*report(cold, warm, refs, rows), load_line(audit)],
    )
    path = write_result(
        "warm_rerun",
        {
            **audit.as_dict(),
            "quick": args.quick,
            "rows": rows,
            "cold": cold,
            "warm": warm,
            "references": refs,
        },
    )
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
