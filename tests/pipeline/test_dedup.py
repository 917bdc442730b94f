"""One call per distinct item in a run, however its duplicates arrive: the same rows in two
files (two batches resolved while the first still sends its calls), and the same item twice in
one row. Before the calls were reserved as soon as an item was found missing, a run of two
identical files made 203-212 calls for 200 distinct items."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes.runs import fake_stats, score

ROWS = 20
ITEMS = 10


def _inputs(folder: Path) -> int:
    """Two files holding the same rows under other ids, one row with an item twice; the
    number of distinct (query, expected, item) triples."""
    folder.mkdir()
    queries = [f"What is fact {r}?" for r in range(ROWS)]
    contexts = [[f"fact {r} is item {i} of row {r}" for i in range(ITEMS)] for r in range(ROWS)]
    contexts[3][7] = contexts[3][2]  # the same item twice in one row
    for name in ("a", "b"):
        table = pa.table(
            {
                "id": [f"{name}{r}" for r in range(ROWS)],
                "query": queries,
                "expected_output": [f"fact {r}" for r in range(ROWS)],
                "contexts": contexts,
            }
        )
        pq.write_table(table, folder / f"{name}.parquet")
    return len({(q, item) for q, items in zip(queries, contexts, strict=True) for item in items})


@pytest.mark.parametrize("batch_rows", [1000, 7, 3])
def test_each_distinct_item_is_judged_once(
    batch_rows: int, server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    distinct = _inputs(tmp_path / "in")
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dedup")
    for attempt in range(3):  # the race depended on timing: several runs, each with a new memo
        before = fake_stats(server)["items_judged"]
        out = tmp_path / f"out{attempt}"
        args = ["-o", out, "--model", "openai/gpt-4o-mini", "--batch-rows", batch_rows]
        assert score(tmp_path / "in", *args, "--cache-dir", tmp_path / f"memo{attempt}") == 0
        assert fake_stats(server)["items_judged"] - before == distinct
        run = json.loads((out / "_ctxprec" / "run.json").read_text(encoding="utf-8"))
        assert run["judge_calls"] == distinct
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["rows"]["ok"] == 2 * ROWS
