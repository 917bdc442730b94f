"""What the tests feed ctxprec, defined once: where the data lives (all of it in the repository:
a fresh clone runs its tests with nothing beside it), how the labelled log's HotpotQA-shaped
columns map onto ctxprec's, a small partitioned input, and a fake API key (key-shaped, so a leak
of it would be caught)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.connectors.sources import ColumnMap

__all__ = [
    "HOTPOT_COLUMNS",
    "HOTPOT_ENV",
    "HOTPOT_MAP",
    "KEY",
    "REPO",
    "SAMPLE",
    "VECTORS",
    "real_hotpot",
    "write_input",
]

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "tests" / "data" / "map_vectors.json"
SAMPLE = REPO / "examples" / "sample.parquet"
# A real HotpotQA-shaped Parquet file to test on instead of the generated log, when given
HOTPOT_ENV = "CTXPREC_TEST_HOTPOT"


def real_hotpot() -> Path | None:
    """The file `CTXPREC_TEST_HOTPOT` names, or None when it is unset or empty. A name that is
    not a file is an error, not a silent fallback to the generated log."""
    named = os.environ.get(HOTPOT_ENV, "").strip()
    if not named:
        return None
    path = Path(named).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{HOTPOT_ENV} names {path}, which is not a file")
    return path


def documentation() -> str:
    """README.md and every docs/ page, one text: what a test looks for in the documentation may
    move between the README and the pages without the test knowing where."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages)


# The labelled log's `question` and `ground_truth` columns, as CLI flags and as a ColumnMap
HOTPOT_MAP = ["--map", "query=question", "--map", "expected=ground_truth"]
HOTPOT_COLUMNS = ColumnMap(query="question", expected="ground_truth")

KEY = "sk-test-SECRET0123456789abcdef"


def write_input(path: Path, ids: range, dt: str = "2024-01-01") -> Path:
    """Rows `r{i}` for i in `ids` (id, query, two contexts, a `dt` column) as one Parquet file."""
    table = pa.table(
        {
            "id": [f"r{i}" for i in ids],
            "query": [f"question {i}?" for i in ids],
            "contexts": [[f"passage {i}", f"other passage {i}"] for i in ids],
            "dt": [dt] * len(ids),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def consistent_rows(
    contexts: list[list[str]], labels: list[list[bool]], limit: int
) -> tuple[list[int], dict[str, bool]]:
    """The first `limit` row indices none of whose items is labelled differently in another row,
    and each item text's label: one verdict per item text is then the truth for a judge."""
    seen: dict[str, bool] = {}
    clash: set[str] = set()
    for ctx, labs in zip(contexts, labels, strict=True):
        for item, label in zip(ctx, labs, strict=True):
            if seen.setdefault(item, label) != label:
                clash.add(item)
    keep = [i for i, ctx in enumerate(contexts) if not clash.intersection(ctx)][:limit]
    return keep, seen
