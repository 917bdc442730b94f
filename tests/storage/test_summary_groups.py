"""summary.md's --group-by table for people: the groups of the lowest and the highest mean score
first, and how many are left out, however many groups there are."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ctxprec.cli.main import main


def _log(path: Path, groups: int, per_group: int = 2) -> Path:
    """Rows whose one answer-bearing item sits at position i % 5 (score 1 / (1 + i % 5) with the
    offline judge), `per_group` rows to each `topic`."""
    n = groups * per_group
    contexts = []
    for i in range(n):
        items = [f"Filler passage {i}-{k} about nothing in particular." for k in range(4)]
        items.insert(i % 5, f"Book {i} was written by Author {i}.")
        contexts.append(items)
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(n)],
            "query": [f"Who wrote book {i}?" for i in range(n)],
            "expected_output": [f"Author {i}" for i in range(n)],
            "contexts": contexts,
            "topic": [f"topic-{i // per_group:03d}" for i in range(n)],
        }
    ).write_parquet(path)
    return path


def _table(md: str, column: str) -> list[list[str]]:
    section = md.split(f"## By {column}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # no header
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_many_groups_show_the_worst_and_the_best_and_say_how_many_are_left_out(
    tmp_path: Path,
) -> None:
    src = _log(tmp_path / "in.parquet", groups=300)
    out = tmp_path / "out"
    assert main(["score", str(src), "-o", str(out), "--group-by", "topic", "--quiet"]) == 0
    md = (out / "summary.md").read_text()
    assert (
        "300 groups: the 10 with the lowest mean score, then the 10 with the highest; 280 of "
        "300 are left out here (summary.json lists the 200 largest)."
    ) in md
    rows = _table(md, "topic")
    assert len(rows) == 21
    assert rows[10][0] == "…"
    means = (
        pl.read_parquet(out / "*.parquet")
        .group_by("topic")
        .agg(pl.col("score").mean().alias("mean"))
        .sort("mean")
    )
    lowest, highest = means["mean"].min(), means["mean"].max()
    assert [float(r[3]) for r in rows[:10]] == sorted(float(r[3]) for r in rows[:10])
    assert float(rows[0][3]) == round(lowest, 4)
    assert float(rows[11][3]) == round(highest, 4)
    summary = json.loads((out / "summary.json").read_text())["by_group"]
    assert summary["groups_total"] == 300
    assert len(summary["groups"]) == 200
    assert len(summary["worst"]) == len(summary["best"]) == 10


def test_few_groups_are_all_shown_lowest_mean_first(tmp_path: Path) -> None:
    src = _log(tmp_path / "in.parquet", groups=6, per_group=3)
    out = tmp_path / "out"
    assert main(["score", str(src), "-o", str(out), "--group-by", "topic", "--quiet"]) == 0
    md = (out / "summary.md").read_text()
    assert "## By topic\n\nLowest mean score first.\n" in md
    rows = _table(md, "topic")
    assert len(rows) == 6
    means = [float(r[3]) for r in rows]
    assert means == sorted(means)
    assert means[0] < means[-1]
