"""What a row costs in each judge mode, measured: `ctxprec score` through the loopback fake judge
(its usage counts: the JSON of the messages it received and of the replies it wrote, about 4
characters a token) on HotpotQA-shaped rows (the file CTXPREC_TEST_HOTPOT names, else the tests'
generated log), priced at gpt-4o-mini's prices (online, and batch at half), for item/row mode
with and without per-item reasons (`--verdict-only`). Beside it: how far verdict-only's verdicts
are from the reasoned mode's (Cohen's κ and flip rate over items) with a noisy judge whose
borderline verdicts move with the prompt's wording (`p_flip_prompt`: a seeded share of (prompt,
item) pairs get the other verdict).

    python bench/cost_per_row.py [--rows 200] [--noise 0.05]

Ragas's and DeepEval's figures are their own default prompts' per-row cost as measured on
2026-11-28 (2.25 and 0.67 $/1k rows); they are quoted, not re-measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import labelled_data  # noqa: E402
from ctxprec.storage.stats.agreement import cohen_kappa  # noqa: E402
from tests.fakes.inputs import HOTPOT_MAP  # noqa: E402
from tests.fakes.runs import fake_stats, judge_process  # noqa: E402

PRICE_IN, PRICE_OUT = (
    0.15,
    0.60,
)  # gpt-4o-mini, USD per 1 M tokens (connectors/judges/providers.toml)
PEERS = {"Ragas (default prompt)": 2.25, "DeepEval (default prompt)": 0.67}
MODES = [("item", False), ("item", True), ("row", False), ("row", True)]


def run(src: Path, out: Path, url: str, mode: str, bare: bool) -> None:
    cmd = [sys.executable, "-m", "ctxprec.cli.main", "score", str(src), "-o", str(out),
           "--model", "openai/gpt-4o-mini", *HOTPOT_MAP, "--mode", mode, "--no-memo",
           "--progress", "off", *(["--verdict-only"] if bare else [])]  # fmt: skip
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-bench",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{mode} verdict-only={bare}: exit {done.returncode}\n{done.stderr}")


def verdicts(out: Path) -> pl.DataFrame:
    rows = pl.read_parquet(out / "*.parquet").select("id", "verdicts").sort("id")
    return rows.with_columns(pl.int_ranges(pl.col("verdicts").list.len()).alias("pos")).explode(
        ["verdicts", "pos"]
    )


def agreement(a: pl.DataFrame, b: pl.DataFrame) -> tuple[float | None, float]:
    both = a.join(b, on=["id", "pos"], suffix="_b").drop_nulls()
    x, y = both["verdicts"], both["verdicts_b"]
    table = [(x & y).sum(), (x & ~y).sum(), (~x & y).sum(), (~x & ~y).sum()]
    return cohen_kappa(table), float((x != y).mean() or 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.05, help="p_flip_prompt of the fake judge")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ctxprec-cost-"))
    src = work / "in.parquet"
    data = labelled_data()
    pl.read_parquet(data).head(args.rows).write_parquet(src)
    results = {}
    with judge_process("--p-flip-prompt", str(args.noise), "--seed", "36") as url:
        for mode, bare in MODES:
            before = fake_stats(url)
            run(src, work / f"{mode}-{bare}", url, mode, bare)
            after = fake_stats(url)
            tin = after["input_tokens"] - before["input_tokens"]
            tout = after["output_tokens"] - before["output_tokens"]
            online = (tin * PRICE_IN + tout * PRICE_OUT) / 1e6 / args.rows * 1000
            results[(mode, bare)] = dict(
                calls=after["total"] - before["total"], input_tokens=tin, output_tokens=tout,
                online=online, batch=online / 2,
            )  # fmt: skip
    ragas = PEERS["Ragas (default prompt)"]
    print(f"{args.rows} HotpotQA-shaped rows ({data.name}), fake judge p_flip_prompt={args.noise}")
    print("| mode | calls | input tokens | output tokens | $/1k rows online | $/1k rows batch "
          "| ÷ Ragas (batch) | κ vs reasoned | flip rate |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for (mode, bare), r in results.items():
        name = f"{mode}, {'verdict-only' if bare else 'with reasons'}"
        kappa, flips = ("–", "–")
        if bare:
            k, f = agreement(verdicts(work / f"{mode}-{bare}"), verdicts(work / f"{mode}-False"))
            kappa, flips = (f"{k:.3f}" if k is not None else "n/a"), f"{f:.3f}"
        print(f"| {name} | {r['calls']:,} | {r['input_tokens']:,} | {r['output_tokens']:,} | "
              f"{r['online']:.3f} | {r['batch']:.3f} | {r['batch'] / ragas:.3f}x | {kappa} | "
              f"{flips} |")  # fmt: skip
    for peer, cost in PEERS.items():
        print(f"| {peer} | | | | {cost:.2f} | | | | |")
    cheapest = min(r["batch"] for r in results.values())
    print(json.dumps({"cheapest_batch_per_1k_rows": round(cheapest, 4),
                      "ratio_to_ragas": round(cheapest / ragas, 4)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
