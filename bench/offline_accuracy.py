"""Accuracy and speed of the offline judge against human relevance labels (HotpotQA sample).

Usage: python bench/offline_accuracy.py [--data PATH] [--variant NAME]
Prints a Markdown table: with and without the expected output; all rows, each half, even/odd rows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import labelled_data  # noqa: E402
from ctxprec.connectors.judges.base import ItemRequest, JudgeStats, NullThrottle  # noqa: E402
from ctxprec.connectors.judges.offline import OfflineJudge  # noqa: E402
from ctxprec.storage.core.metric import map_score  # noqa: E402
from ctxprec.storage.core.settings import JudgeSettings  # noqa: E402

__all__ = ["Scores", "main", "score"]


@dataclass(frozen=True, slots=True)
class Scores:
    """Item-level agreement with the labels plus the row-level MAP comparison."""

    items: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    kappa: float
    map_judge: float
    map_labels: float
    map_abs_diff: float  # mean over rows of |MAP(judge) - MAP(labels)|


def score(predicted: Sequence[Sequence[bool]], labels: Sequence[Sequence[bool]]) -> Scores:
    """Compare per-row verdict lists with per-row label lists."""
    tp = fp = fn = tn = 0
    for pred_row, gold_row in zip(predicted, labels, strict=True):
        for p, g in zip(pred_row, gold_row, strict=True):
            tp += p and g
            fp += p and not g
            fn += g and not p
            tn += not p and not g
    n = tp + fp + fn + tn
    accuracy = (tp + tn) / n if n else 0.0
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    chance = ((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp)) / (n * n) if n else 0.0
    kappa = (accuracy - chance) / (1 - chance) if chance < 1 else 0.0
    rows = len(labels)
    judge_maps = [map_score(r) for r in predicted]
    label_maps = [map_score(r) for r in labels]
    map_judge = sum(judge_maps) / rows if rows else 0.0
    map_labels = sum(label_maps) / rows if rows else 0.0
    diff = sum(abs(a - b) for a, b in zip(judge_maps, label_maps, strict=True))
    return Scores(
        n, accuracy, precision, recall, f1, kappa, map_judge, map_labels, diff / rows if rows else 0
    )


async def _judge_all(
    judge: OfflineJudge, df: pl.DataFrame, with_expected: bool
) -> tuple[list[list[bool]], float]:
    verdicts: list[list[bool]] = []
    start = time.perf_counter()
    for question, truth, contexts in zip(
        df["question"], df["ground_truth"], df["contexts"], strict=True
    ):
        expected = truth if with_expected else None
        row: list[bool] = []
        for item in contexts:
            reply = await judge.judge_item(ItemRequest(question, expected, item))
            row.append(reply.verdict.relevant)
        verdicts.append(row)
    return verdicts, time.perf_counter() - start


def _row(label: str, part: str, s: Scores) -> str:
    return (
        f"| {label} | {part} | {s.items} | {s.accuracy:.3f} | {s.precision:.3f} | "
        f"{s.recall:.3f} | {s.f1:.3f} | {s.kappa:.3f} | {s.map_judge:.3f} | {s.map_labels:.3f} | "
        f"{s.map_abs_diff:.3f} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=None, help="Parquet dataset (default: CTXPREC_TEST_HOTPOT)"
    )
    parser.add_argument("--variant", default="", help="offline judge variant (default, strict…)")
    args = parser.parse_args(argv)
    args.data = args.data or labelled_data()
    if not args.data.exists():
        print(f"dataset not found: {args.data} (pass --data PATH)", file=sys.stderr)
        return 2

    df = pl.read_parquet(
        args.data, columns=["id", "question", "ground_truth", "contexts", "labels"]
    )
    labels: list[list[bool]] = [list(x) for x in df["labels"]]
    half = len(df) // 2
    parts = {
        "all": slice(0, len(df)),
        "1st half": slice(0, half),
        "2nd half": slice(half, None),
        "even rows": slice(0, None, 2),
        "odd rows": slice(1, None, 2),
    }
    judge = OfflineJudge(args.variant, JudgeSettings(), NullThrottle(), JudgeStats())

    lines = [
        "| judge | rows | items | accuracy | precision | recall | F1 | Cohen's κ "
        "| mean MAP (judge) | mean MAP (labels) | mean per-row MAP error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    speeds: list[str] = []
    baseline = [[False] * len(r) for r in labels]
    for part, sl in parts.items():
        lines.append(_row("always not relevant", part, score(baseline[sl], labels[sl])))
    for with_expected in (True, False):
        name = f"{judge.model} ({'query + expected' if with_expected else 'query only'})"
        verdicts, elapsed = asyncio.run(_judge_all(judge, df, with_expected))
        n_items = sum(len(r) for r in verdicts)
        speeds.append(
            f"{name}: {n_items / elapsed:,.0f} items/s ({elapsed / n_items * 1e6:.1f} µs/item)"
        )
        for part, sl in parts.items():
            lines.append(_row(name, part, score(verdicts[sl], labels[sl])))

    print(
        f"Dataset: {args.data.name} ({len(df)} rows; halves = rows 0-{half - 1} and {half}-"
        f"{len(df) - 1}). If the file is ordered by question type the halves differ by type;"
        " even/odd rows are the interleaved split that checks for over-fitting."
    )
    print("\n".join(lines))
    print()
    for s in speeds:
        print(s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
