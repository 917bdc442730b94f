"""Rate-limit adherence: `ctxprec score` against a fake judge that allows R requests per sliding
minute and answers 429 (with Retry-After) beyond that.

Two modes, each with its own server process (`--rpm-limit R`, ~100 ms latency) and more items
than it can finish, stopped with SIGINT after `--duration` seconds:

(a) configured: `--rpm R`. Figures: 429s at the server (goal 0), accepted calls/min (whole run,
    after the first minute, and the busiest sliding minute).
(b) adaptive: no --rpm; ctxprec has to find the limit from the 429s. Figure: accepted requests per
    minute after the first minute ÷ R (goal ≥ 0.9), over the whole minutes that fit in the run
    (190 s by default: minutes 2 and 3), plus the 429 count and the longest idle stretch.

The server's cumulative outcome counts are polled once a second (GET /_fake/stats), so accepted
and rejected requests are told apart over time without changing the server. By default the two
modes run at the same time (separate servers and clients; each sends ~R/60 requests a second, so
they barely load the machine); --sequential runs them one after the other.

Usage: python bench/rate_limit.py [--quick] [--rpm 600] [--duration 190] [--sequential]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from bisect import bisect_left
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import (
    CpuAudit,
    FakeServer,
    check_ok,
    child_env,
    ctxprec_cmd,
    fake_server,
    load_line,
    make_dataset,
    print_block,
    run_measured,
    verdict,
    workdir,
    write_result,
)

GOAL_ADAPTIVE = 0.9
MODES = ("configured", "adaptive")


class StatsPoller:
    """Polls the server's cumulative counts about once a second: (t, ok, 429s, total)."""

    def __init__(self, server: FakeServer, every_s: float = 1.0) -> None:
        self.server = server
        self.every_s = every_s
        self.points: list[tuple[float, int, int, int]] = []
        self._last = -float("inf")

    def __call__(self, pid: int) -> None:
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.poll()

    def poll(self) -> None:
        s = self.server.stats()
        out = s["by_outcome"]
        t = time.perf_counter()
        self.points.append((t, int(out.get("ok", 0)), int(out.get("rpm_429", 0)), s["total"]))


def _count_at(points: list[tuple[float, int, int, int]], t: float, field: int) -> float:
    """A cumulative count at time t, interpolated between polls."""
    times = [p[0] for p in points]
    i = bisect_left(times, t)
    if i <= 0:
        return float(points[0][field])
    if i >= len(points):
        return float(points[-1][field])
    (t0, *a), (t1, *b) = points[i - 1], points[i]
    w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
    return a[field - 1] + w * (b[field - 1] - a[field - 1])


def _windows(points: list[tuple[float, int, int, int]], start: float, end: float) -> list[float]:
    """Accepted requests in each window [t, t + 60 s] starting at a poll in [start, end - 60]."""
    return [
        _count_at(points, t + 60.0, 1) - _count_at(points, t, 1)
        for t, *_ in points
        if start <= t and t + 60.0 <= end
    ]


def _longest_idle(points: list[tuple[float, int, int, int]]) -> float:
    """The longest stretch between polls without a newly accepted request (seconds)."""
    longest, since = 0.0, points[0][0]
    for (_, ok0, *_), (t1, ok1, *_) in itertools.pairwise(points):
        if ok1 != ok0:
            since = t1
        longest = max(longest, t1 - since)
    return longest


def per_minute(points: list[tuple[float, int, int, int]], rpm: int) -> dict[str, Any]:
    """Accepted per minute: over the run; after the first minute (the adherence figure); in the
    last 30 s (the settled rate); per full minute. Also the busiest sliding 60 s, the 429s and
    the longest time without an accepted request (bursts followed by pauses show up there).

    "After the first minute" is the k whole minutes [first request + 60 s, + 60 s + k min] that
    fit in the run: a server allowing R per sliding minute accepts at most k x R in any such
    span, so the figure cannot exceed 1.0 x R by where the span starts or ends relative to a
    burst (a span of, say, 1.5 minutes can hold two bursts of R)."""
    active = [p for p in points if p[3] > 0]
    if len(active) < 2:
        return {"error": "the server saw no requests"}
    start = active[0][0] - 0.5  # first request: within half a poll before the first poll seeing it
    end = active[-1][0]
    span = end - start
    minutes = [
        _count_at(active, start + 60.0 * (k + 1), 1) - _count_at(active, start + 60.0 * k, 1)
        for k in range(int(span // 60))
    ]
    after = minutes[1:]
    per_min_after = sum(after) / len(after) if after else None
    rejected_after = active[-1][2] - _count_at(active, start + 60.0, 2) if span > 60 else None
    return {
        "span_s": span,
        "accepted": active[-1][1],
        "rejected_429": active[-1][2],
        "accepted_per_min": active[-1][1] / span * 60.0,
        "whole_minutes_after_first": len(after),
        "accepted_per_min_after_first": per_min_after,
        "ratio_after_first": None if per_min_after is None else per_min_after / rpm,
        "rejected_after_first": rejected_after,
        "accepted_per_min_last_30s": (active[-1][1] - _count_at(active, end - 30.0, 1)) * 2.0
        if span > 40
        else None,
        "busiest_minute": max(_windows(active, start, end), default=None),
        "full_minutes": minutes,
        "longest_idle_s": _longest_idle(active),
        "points": [(round(t - start, 2), ok, rej) for t, ok, rej, _ in active],
    }


def run_mode(mode: str, data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One server + one ctxprec, cut short after `duration` seconds."""
    server_args = [
        "--rpm-limit",
        str(args.rpm),
        "--latency-ms",
        f"{args.latency_ms:g}",
        "--jitter-ms",
        f"{args.jitter_ms:g}",
    ]
    extra = ["--rpm", str(args.rpm)] if mode == "configured" else []
    with fake_server(*server_args) as server:
        poller = StatsPoller(server)
        cmd = ctxprec_cmd(data, work / f"out-{mode}", "--model", "openai/fake", "--no-memo", *extra)
        m = run_measured(
            cmd,
            env=child_env(OPENAI_BASE_URL=server.url),
            interrupt_after_s=args.duration,
            on_poll=poller,
        )
        poller.poll()
    check_ok(m, f"ctxprec ({mode})", allowed=(0, 1, 130))
    return {"mode": mode, "exit_code": m.returncode, **per_minute(poller.points, args.rpm)}


def _configured_lines(a: dict[str, Any], rpm: int) -> list[str]:
    return [
        f"(a) --rpm {rpm}: 429s at the server {a['rejected_429']} (goal 0) "
        f"{verdict(a['rejected_429'] == 0)}; accepted {a['accepted_per_min']:.0f}/min over "
        f"{a['span_s']:.0f} s, {_fmt(a['accepted_per_min_after_first'])}/min in the "
        f"{a['whole_minutes_after_first']} whole minute(s) after the first "
        f"({_fmt(a['ratio_after_first'], '.3f')} x R); busiest 60 s "
        f"{_fmt(a['busiest_minute'])}",
    ]


def _adaptive_lines(b: dict[str, Any]) -> list[str]:
    ratio = b["ratio_after_first"]
    return [
        f"(b) adaptive (no --rpm): accepted/min after the first minute "
        f"{_fmt(b['accepted_per_min_after_first'])} = {_fmt(ratio, '.3f')} x R "
        f"(over {b['whole_minutes_after_first']} whole minute(s)) "
        f"(goal ≥ {GOAL_ADAPTIVE}) {verdict((ratio or 0) >= GOAL_ADAPTIVE)}",
        f"    429s: {b['rejected_429']} in all, {_fmt(b['rejected_after_first'])} after the first "
        f"minute; accepted {b['accepted_per_min']:.0f}/min over {b['span_s']:.0f} s; busiest 60 s "
        f"{_fmt(b['busiest_minute'])}",
    ]


def report(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        f"server limit R = {args.rpm}/min (sliding 60 s), latency {args.latency_ms:g} ± "
        f"{args.jitter_ms:g} ms; each mode runs {args.duration:g} s"
    ]
    for mode, r in runs.items():
        if "error" in r:
            lines.append(f"{mode}: {r['error']}")
            continue
        lines += _configured_lines(r, args.rpm) if mode == "configured" else _adaptive_lines(r)
        minutes = ", ".join(f"{x:.0f}" for x in r["full_minutes"])
        lines.append(
            f"    accepted per full minute since the first request: {minutes}; last 30 s: "
            f"{_fmt(r['accepted_per_min_last_30s'])}/min; longest time without an accepted "
            f"request: {r['longest_idle_s']:.0f} s"
        )
    return lines


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=int, default=600, help="the server's limit R")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--duration", type=float, default=190.0, help="seconds per mode")
    parser.add_argument("--sequential", action="store_true", help="one mode after the other")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="smoke run: 130 s per mode")
    parser.add_argument("--workdir", type=Path, help="keep inputs/outputs here (default: temp)")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    if args.quick:
        args.duration = 130.0
    items = int(args.duration * args.rpm / 60 * 4) + 100  # never runs out before the cut
    with workdir(args.workdir) as work:
        data = make_dataset(work / "items.parquet", -(-items // 10))
        with ThreadPoolExecutor(1 if args.sequential else 2) as pool:
            futures = {m: pool.submit(run_mode, m, data, work, args) for m in args.modes}
            runs = {m: f.result() for m, f in futures.items()}
    print_block(
        "rate limit: 429s with --rpm R, and adaptive rate without it",
        [*report(runs, args), load_line(audit)],
    )
    path = write_result(
        "rate_limit",
        {
            **audit.as_dict(),
            "quick": args.quick,
            "rpm": args.rpm,
            "latency_ms": args.latency_ms,
            "jitter_ms": args.jitter_ms,
            "duration_s": args.duration,
            "runs": runs,
        },
    )
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
