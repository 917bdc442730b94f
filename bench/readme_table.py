"""The table of figures (docs/performance.md): rows built from one run's JSON results, and
the marked block of the page they replace in place (`run_all.py` runs the benchmarks, this
module only renders).

Standard library only, so a test can render and replace without running anything.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START = "<!-- bench-table:start: written by bench/run_all.py from its results; edit the script -->"
END = "<!-- bench-table:end -->"
START_PREFIX = "<!-- bench-table:start"
HEADER = ["| benchmark | figure | goal | result | command |", "|---|---|---|---|---|"]
NOISY = 0.3  # cores used by other processes above which a timing figure is suspect

Row = tuple[str, str, str, str]  # benchmark, figure, goal, result


@dataclass(frozen=True, slots=True)
class Ran:
    """One benchmark of a run: its name, the command shown, its exit code and duration."""

    name: str
    command: str
    exit_code: int = 0
    seconds: float | None = None


def _pf(ok: bool) -> str:
    return "✅" if ok else "❌"


def _throughput(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for x in r["results"]:
        c, b, n = x["ctxprec"], x["bare"], x["concurrency"]
        rows.append(
            (
                "throughput",
                f"calls/s ctxprec ÷ bare aiohttp loop, {n} in flight",
                "≥ 0.95",
                f"{_pf(x['ratio'] >= 0.95)} {x['ratio']:.3f} ({c['calls_per_s']:,.0f} vs "
                f"{b['calls_per_s']:,.0f} calls/s; ideal {x['ideal_calls_per_s']:,.0f}; "
                f"{x['calls']:,} calls)",
            )
        )
    for x in r["results"]:
        c, b, n = x["ctxprec"], x["bare"], x["concurrency"]
        ms = c["client_cpu_ms_per_call"]
        rows.append(
            (
                "throughput",
                f"client CPU per judge call, {n} in flight",
                "≤ 1.5 ms",
                f"{_pf(ms <= 1.5)} {ms:.2f} ms (bare loop {b['client_cpu_ms_per_call']:.2f} ms)",
            )
        )
    cpu = r.get("cpu")
    if cpu:
        sides = [("the lean bare loop", cpu)]
        if cpu.get("as_filed"):
            filed = "the pandas-reading bare loop (pq.read_table)"
            sides.append((filed, cpu["as_filed"]))
        for label, x in sides:
            rows.append(
                (
                    "throughput",
                    f"client CPU of {cpu['calls']:,} calls ({cpu['concurrency']} in flight), "
                    f"whole process, ctxprec ÷ {label}",
                    "≤ 1.25x",
                    f"{_pf(x['ratio'] <= 1.25)} {x['ratio']:.2f}x ({x['ctxprec_cpu_s']:.2f} vs "
                    f"{x['bare_cpu_s']:.2f} s"
                    + (
                        f"; median of interleaved rounds {', '.join(f'{v:.2f}x' for v in pairs)})"
                        if (pairs := x.get("pair_ratios"))
                        else ")"
                    ),
                )
            )
    return rows


def _warm(r: dict[str, Any]) -> list[Row]:
    w, c = r["warm"], r["cold"]
    refs = r.get("references") or {}
    loop = refs.get("diskcache_keys_per_s")
    select = refs.get("select_keys_per_s")
    judge = refs.get("judge_items_per_s")
    rows: list[Row] = [
        (
            "warm_rerun",
            f"items/s of a re-run, all memo hits ({w['items']:,} items)",
            "≥ 100,000",
            f"{_pf(w['items_per_s'] >= 100_000)} {w['items_per_s']:,.0f} (run.json "
            f"{w['run_items_per_s']:,.0f}"
            + (f"; plain diskcache get loop {loop:,.0f} keys/s" if loop else "")
            + ")",
        ),
    ]
    if select:
        ratio = w["items_per_s"] / select
        rows.append(
            (
                "warm_rerun",
                "re-run ÷ a batched SQLite SELECT of the same keys (process wall)",
                "≥ 0.8x",
                f"{_pf(ratio >= 0.8)} {ratio:.2f}x ({w['items_per_s']:,.0f} items/s vs "
                f"{select:,.0f} keys/s)",
            )
        )
    rows.append(
        (
            "warm_rerun",
            "items/s of a cold run, offline judge (same input)",
            "≥ 25,000",
            f"{_pf(c['items_per_s'] >= 25_000)} {c['items_per_s']:,.0f}"
            + (f" (the offline judge alone {judge:,.0f} items/s)" if judge else ""),
        )
    )
    if judge:
        ratio = c["items_per_s"] / judge
        rows.append(
            (
                "warm_rerun",
                "cold run ÷ the offline judge alone on the same items (process wall)",
                "≥ 0.8x",
                f"{_pf(ratio >= 0.8)} {ratio:.2f}x",
            )
        )
    return rows


def _startup(r: dict[str, Any]) -> list[Row]:
    return [
        (
            "startup",
            f"`ctxprec --{name}` wall time (median)",
            f"≤ {goal} s",
            f"{_pf(r[name] <= goal)} {r[name]:.3f} s (python -c pass {r['python']:.3f} s)",
        )
        for name, goal in (("version", 0.15), ("help", 0.4))
    ]


def _reduce(r: dict[str, Any]) -> list[Row]:
    same = r["identical_ap"] and r["identical_score"]
    return [
        (
            "reduce_stage",
            f"map_stage verdicts/s ({r['verdicts'] / 1e6:.0f} M verdicts)",
            "≥ 20 M",
            f"{_pf(r['verdicts_per_s'] >= 20e6)} {r['verdicts_per_s'] / 1e6:.1f} M",
        ),
        (
            "reduce_stage",
            "map_stage ÷ Python loop (average_precision per row)",
            "≥ 30x",
            f"{_pf(r['speedup'] >= 30)} {r['speedup']:.1f}x (loop "
            f"{r['loop_verdicts_per_s'] / 1e6:.1f} M/s; identical scores: {same})",
        ),
    ]


def _memory(r: dict[str, Any]) -> list[Row]:
    lo, hi = r["runs"][0], r["runs"][-1]
    ratio = r["ratio_largest_smallest"]
    return [
        (
            "memory",
            f"peak RSS {hi['rows']:,} ÷ {lo['rows']:,} rows (offline, --no-memo)",
            "≤ 1.2x",
            f"{_pf(ratio <= 1.2)} {ratio:.2f}x ({hi['maxrss_mib']:.0f} vs {lo['maxrss_mib']:.0f} "
            f"MiB; {hi['rows_per_s']:,.0f} rows/s)",
        )
    ]


def _rate(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    runs, rpm = r["runs"], r["rpm"]
    if "configured" in runs and "error" not in runs["configured"]:
        a = runs["configured"]
        rows.append(
            (
                "rate_limit",
                f"429s with --rpm {rpm} (server limit {rpm}/min)",
                "0",
                f"{_pf(a['rejected_429'] == 0)} {a['rejected_429']} (accepted "
                f"{a['accepted_per_min']:.0f}/min over {a['span_s']:.0f} s)",
            )
        )
    if "adaptive" in runs and "error" not in runs["adaptive"]:
        b = runs["adaptive"]
        ratio = b["ratio_after_first"] or 0.0
        rows.append(
            (
                "rate_limit",
                "adaptive (no --rpm): accepted/min after the first minute ÷ R",
                "≥ 0.9",
                f"{_pf(ratio >= 0.9)} {ratio:.3f} ({b['rejected_429']} 429s; "
                f"{b['span_s']:.0f} s run)",
            )
        )
    return rows


def _dask(r: dict[str, Any]) -> list[Row]:
    runs = {x["name"]: x for x in r["scaling"]}
    local, one, two = runs["local"], runs["dask x1"], runs["dask x2"]
    rate = r["rate"]
    limit = rate["limit_per_s"]
    return [
        (
            "dask_scaling",
            f"judge calls/s, 2 workers ÷ 1 ({r['latency_ms']:g} ms judge)",
            "–",
            f"{two['calls_per_s'] / one['calls_per_s']:.2f}x ({two['calls_per_s']:.0f} vs "
            f"{one['calls_per_s']:.0f} calls/s; local engine {local['calls_per_s']:.0f})",
        ),
        (
            "dask_scaling",
            f"requests/s at the judge, 2 workers, cluster-wide --rpm {rate['rpm']:g}",
            f"≤ {limit:g}/s",
            f"{_pf(rate['mean_per_s'] <= limit * 1.01)} mean {rate['mean_per_s']:.1f}/s "
            f"(busiest second {rate['max_per_s']}; busiest 10 s {rate['busiest_10s']}, "
            f"limit {rate['limit_10s']:g})",
        ),
    ]


def _backfill(r: dict[str, Any]) -> list[Row]:
    workers = ", ".join(f"{w:.0f}" for w in r["worker_peak_mib"])
    ratio = r["requests_per_distinct"]
    return [
        (
            "dask_backfill",
            f"judge requests ÷ distinct pairs, {r['items']:,} items in {r['files']} files",
            "1.00",
            f"{_pf(ratio <= 1.0)} {ratio:.3f} ({r['requests']:,} for {r['distinct_pairs']:,})",
        ),
        (
            "dask_backfill",
            f"judge calls/s per worker, {r['workers']} workers (loopback judge)",
            "–",
            f"{r['calls_per_s_per_worker']:.0f} ({r['judging_s']} s judging, run "
            f"{r['wall_s']:.0f} s)",
        ),
        (
            "dask_backfill",
            "peak RSS, client and each worker",
            "–",
            f"client {r['client_peak_mib']:.0f} MiB, workers {workers} MiB",
        ),
    ]


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "reduce_stage": _reduce,
    "warm_rerun": _warm,
    "throughput": _throughput,
    "memory": _memory,
    "rate_limit": _rate,
    "dask_scaling": _dask,
    "startup": _startup,
    "dask_backfill": _backfill,
}


def _other_cores(result: dict[str, Any]) -> tuple[float, float]:
    """(busy cores at the start, other processes' cores on average during the run)."""
    return (
        float(result.get("busy_cores_at_start", 0.0)),
        float(result.get("other_cores_during", 0.0)),
    )


def table(ran: Sequence[Ran], folder: Path) -> list[str]:
    """The Markdown table, from the result files of one run in `folder`."""
    lines = list(HEADER)
    for one in ran:
        path = folder / f"{one.name}.json"
        if one.exit_code != 0 or not path.is_file():
            lines.append(f"| {one.name} | (failed: exit {one.exit_code}) | | | `{one.command}` |")
            continue
        result = json.loads(path.read_text(encoding="utf-8"))
        start, during = _other_cores(result)
        noisy = (
            f" ⚠ other processes used {max(start, during):.2f} cores meanwhile"
            if max(start, during) > NOISY
            else ""
        )
        for bench, figure, goal, value in ROWS[one.name](result):
            lines.append(f"| {bench} | {figure} | {goal} | {value}{noisy} | `{one.command}` |")
    return lines


def footer(ran: Sequence[Ran], folder: Path, machine: str, finished: str) -> str:
    """One line under the table: when and on what it was measured, and how idle the machine was."""
    results = [folder / f"{r.name}.json" for r in ran]
    readings = [
        _other_cores(json.loads(p.read_text(encoding="utf-8"))) for p in results if p.is_file()
    ]
    start = max((s for s, _ in readings), default=0.0)
    during = max((d for _, d in readings), default=0.0)
    idle = (
        f"other processes used at most {start:.2f} cores as a benchmark started and "
        f"{during:.2f} on average while one ran"
    )
    if max(start, during) > NOISY:
        idle += " (⚠: rows so marked are suspect)"
    timed = [r for r in ran if r.seconds is not None]
    if len(timed) == len(ran) and ran:
        took = ", ".join(f"{r.name} {r.seconds:.0f} s" for r in timed)
        total = sum(r.seconds or 0.0 for r in timed) / 60
        how = f"`python bench/run_all.py` finished {finished}, {total:.1f} min: {took}"
    else:
        how = f"rendered from saved results by `bench/run_all.py --from-results`, {finished}"
    return f"({how}; machine: {machine}; {idle})"


def block(ran: Sequence[Ran], folder: Path, machine: str, finished: str) -> str:
    """The table and its footer line: what goes between the markers."""
    return "\n".join([*table(ran, folder), "", footer(ran, folder, machine, finished)])


def replace_block(text: str, new_block: str) -> str:
    """`text` with the lines between the start and end markers replaced by `new_block`; every
    other byte is kept. Raises ValueError unless there is exactly one start marker followed by
    exactly one end marker."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(START_PREFIX)]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(
            f"the page needs one line starting {START_PREFIX!r} followed by one line {END!r} "
            f"(found {len(starts)} start and {len(ends)} end markers)"
        )
    body = new_block.strip("\n") + "\n"
    return "".join([*lines[: starts[0]], START + "\n", "\n", body, "\n", *lines[ends[0] :]])


def write_block(readme: Path, new_block: str) -> bool:
    """Replace the marked block of `readme` in place (temp file + rename); True if it changed."""
    old = readme.read_text(encoding="utf-8")
    new = replace_block(old, new_block)
    if new == old:
        return False
    fd, tmp = tempfile.mkstemp(dir=readme.parent, prefix=f".{readme.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(new)
        os.replace(tmp, readme)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
