"""The rows summary.html opens, without a browser: the lowest-scored rows and a fixed sample
read lazily from the part files, what each relevant item added to AP, texts from the output or
from the input as the run read it, markup escaped, and a page that stays small for a large
output."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from ctxprec.cli.main import main
from ctxprec.connectors.sources import INPUT_ERROR
from ctxprec.storage.core.metric import average_precision, map_score, round_half_up
from ctxprec.storage.outdir.schema import output_schema
from ctxprec.storage.report.rows import (
    SAMPLE,
    WORST,
    RunTexts,
    Texts,
    _choose,
    item_gains,
    report_rows,
)
from ctxprec.storage.report.summary import build_summary, write_summary
from tests.fakes.folders import commit
from tests.fakes.runs import score


@given(st.lists(st.booleans(), max_size=12))
def test_what_each_item_added_sums_to_the_score(verdicts: list[bool]) -> None:
    gains = item_gains(verdicts)
    assert [g is not None for g in gains] == verdicts
    total = sum(g for g in gains if g is not None)
    assert abs(total - average_precision(verdicts)) < 1e-12
    assert map_score(verdicts) == round_half_up(total)


def test_an_unjudged_item_adds_nothing_known() -> None:
    assert item_gains([True, None, True]) == [None, None, None]
    assert item_gains([False, True, False, True]) == [None, 0.25, None, 0.25]


def _write(outdir: Path, n: int, reasons: int = 40, seed: int = 7) -> list[Path]:
    """`n` scored rows (a few failed) in parts of 100,000 rows, as a run writes them."""
    rng = random.Random(seed)
    schema = output_schema()
    parts, start = [], 0
    while start < n:
        size = min(100_000, n - start)
        verdicts = [[rng.random() < 0.3 for _ in range(10)] for _ in range(size)]
        failed = [(start + i) % 997 == 5 for i in range(size)]
        table = {
            "id": [f"row{start + i:07d}" for i in range(size)],
            "score": [None if f else map_score(v) for v, f in zip(verdicts, failed, strict=True)],
            "status": ["failed" if f else "ok" for f in failed],
            "error": ["http_500: boom" if f else None for f in failed],
            "reason": ["r"] * size,
            "verdicts": verdicts,
            "verdict_reasons": [["x" * reasons] * 10] * size,
            "context_count": [10] * size,
        }
        cols = {f.name: table.get(f.name) for f in schema}
        for f in schema:
            if cols[f.name] is None:
                default = {"judge_model": "m", "prompt_version": "v", "scored_at": 0}
                fill = default.get(f.name, 0 if pa.types.is_integer(f.type) else None)
                cols[f.name] = [fill] * size
        path = outdir / f"part-{len(parts):05d}.parquet"
        pq.write_table(pa.table(cols, schema=schema), path)
        parts.append(path)
        start += size
    commit(outdir, *parts)
    return parts


def test_the_worst_rows_are_the_lowest_and_the_sample_is_fixed(tmp_path: Path) -> None:
    parts = _write(tmp_path, 3000)
    got = report_rows(parts)
    table = pq.read_table(parts[0]).to_pylist()
    ok = sorted((r["score"], r["id"]) for r in table if r["status"] == "ok")
    assert [r["id"] for r in got["worst"]] == [i for _, i in ok[:50]]
    assert len(got["sample"]) == 50
    assert {r["id"] for r in got["sample"]}.isdisjoint(r["id"] for r in got["worst"])
    assert [r["id"] for r in report_rows(parts)["sample"]] == [r["id"] for r in got["sample"]]
    assert {r["status"] for r in got["failed"]} == {"failed"}
    assert len(got["failed"]) == 4
    row = got["worst"][0]
    assert [i["verdict"] for i in row["items"]] == table[int(row["id"][3:])]["verdicts"]
    assert row["texts"] is False  # the output holds no item texts and there is no input here


def test_a_million_row_output_gives_a_page_of_a_few_mb(tmp_path: Path) -> None:
    _write(tmp_path, 1_000_000, reasons=120)
    summary = build_summary(tmp_path, {})
    write_summary(tmp_path, summary, charts=False)
    page = (tmp_path / "summary.html").read_bytes()
    assert len(page) < 3_000_000
    assert page.count(b'<details class="row"') == 50 + 20 + 50


def _hostile_input(path: Path) -> Path:
    table = pa.table(
        {
            "id": ["a", "b"],
            "query": ["<script>alert(1)</script> capital of France?", "Who wrote Hamlet?"],
            "contexts": [
                ["Paris is the capital of France.", '<img src=x onerror="alert(2)">'],
                ['" onload="alert(3)', "Shakespeare wrote Hamlet."],
            ],
            "expected_output": ["Paris", "Shakespeare"],
        }
    )
    pq.write_table(table, path)
    return path


def test_texts_come_from_the_input_as_the_run_read_it(tmp_path: Path) -> None:
    src = _hostile_input(tmp_path / "in.parquet")
    assert score(src, "-o", tmp_path / "out") == 0
    page = (tmp_path / "out" / "summary.html").read_text(encoding="utf-8")
    assert "Shakespeare wrote Hamlet." in page
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in page
    assert "&quot; onload=&quot;alert(3)" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "<img" not in page.lower()
    # the input moved on (other texts, a later mtime): the report keeps showing what was scored
    table = pq.read_table(src)
    items = pa.array([["Marlowe wrote it."], ["Bacon wrote it."]], pa.list_(pa.string()))
    pq.write_table(
        table.set_column(table.schema.get_field_index("contexts"), "contexts", items), src
    )
    stat = src.stat()
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert main(["summary", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "summary.html").read_text(encoding="utf-8")
    assert "Shakespeare wrote Hamlet." in page
    assert "Bacon" not in page
    # without the texts the report kept, a changed input is not read back: no texts at all
    (tmp_path / "out" / "_ctxprec" / "report-texts.json").unlink()
    assert main(["summary", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "summary.html").read_text(encoding="utf-8")
    assert "Shakespeare wrote Hamlet." not in page
    assert "Item texts are not in the output" in page


def test_texts_kept_with_passthrough_need_no_input(tmp_path: Path) -> None:
    src = _hostile_input(tmp_path / "in.parquet")
    args = ["-o", tmp_path / "out", "--passthrough", "contexts,query"]
    assert score(src, *args) == 0
    src.unlink()
    assert main(["summary", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "summary.html").read_text(encoding="utf-8")
    assert "Shakespeare wrote Hamlet." in page
    s = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert f'data-figure="mean">{s["score"]["mean"]:g}<' in page


def _chunks(rng: random.Random, n: int) -> tuple[pl.DataFrame, list[float], list[str]]:
    ids = [f"r{rng.randrange(10**9):09d}" for _ in range(n)]
    scores = [rng.choice([0.0, 0.0, 0.25, 0.5, 1.0, rng.random()]) for _ in range(n)]
    statuses = [rng.choice(["ok"] * 20 + ["failed", "empty_context"]) for _ in range(n)]
    frame = pl.DataFrame(
        {"id": ids, "query": [f"q{i}" for i in range(n)], "context": [[f"c{i}"] for i in range(n)]}
    )
    return frame, scores, statuses


def test_a_run_keeps_the_texts_of_every_row_its_report_opens() -> None:
    """Chunks of any size, ties in the scores, failed rows: every id the report picks over the
    whole output is among the texts kept chunk by chunk, so the input is not read again; ids
    the run did not keep (an earlier run's rows) go to the fallback."""
    for seed in range(5):
        rng = random.Random(seed)
        frame, scores, statuses = _chunks(rng, 4000)
        kept = RunTexts(INPUT_ERROR)
        start = 0
        while start < frame.height:
            size = rng.randrange(1, 700)
            stop = start + size
            kept.add(frame[start:stop], scores[start:stop], statuses[start:stop])
            start = stop
        whole = pl.DataFrame(
            {
                "id": frame.get_column("id"),
                "score": [
                    s if st == "ok" else None for s, st in zip(scores, statuses, strict=True)
                ],
                "status": statuses,
                "_file": ["f"] * frame.height,
            }
        )
        sections, _ = _choose(whole.lazy(), WORST, SAMPLE)
        wanted = [i for group in sections.values() for i in group]
        asked: list[Sequence[str]] = []

        def fallback(ids: Sequence[str], asked: list[Sequence[str]] = asked) -> Texts:
            asked.append(list(ids))
            return {}

        texts = kept.lookup(fallback)(wanted)
        assert asked == []
        assert sorted(texts) == sorted(wanted)
        row = frame.row(frame.get_column("id").to_list().index(wanted[0]), named=True)
        assert texts[wanted[0]] == {"query": row["query"], "context": row["context"]}
        kept.lookup(fallback)(["not-this-run"])
        assert asked == [["not-this-run"]]


def test_the_runs_page_equals_the_page_read_back_from_its_input(tmp_path: Path) -> None:
    """The run's summary.html (texts kept as it scored, 43 chunks) is the one `ctxprec summary`
    writes from the input read back; a JSON Lines input, which is not read back, shows its
    texts in the run's page too."""
    rng = random.Random(11)
    n = 300
    rows = {
        "id": [f"q{i:04d}" for i in range(n)],
        "query": [f"question {i}?" for i in range(n)],
        "expected_output": [f"answer {i}" for i in range(n)],
        "contexts": [
            [f"answer {i} is here" if rng.random() < 0.4 else f"other {i}.{j}" for j in range(5)]
            for i in range(n)
        ],
    }
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table(rows), src)
    assert score(src, "-o", tmp_path / "out", "--batch-rows", "7") == 0
    page = (tmp_path / "out" / "summary.html").read_bytes()
    assert page.count(b'<details class="row"') == 100
    assert main(["summary", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "summary.html").read_bytes() == page
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(
            json.dumps(dict(zip(rows, values, strict=True))) + "\n"
            for values in zip(*rows.values(), strict=True)
        ),
        encoding="utf-8",
    )
    assert score(lines, "-o", tmp_path / "out-jsonl", "--batch-rows", "7") == 0
    shown = (tmp_path / "out-jsonl" / "summary.html").read_text(encoding="utf-8")
    assert "Item texts are not in the output" not in shown
    assert shown.count("question ") >= 100


def _texts_log(n: int = 120) -> dict[str, list[object]]:
    rng = random.Random(5)
    return {
        "id": [f"q{i:04d}" for i in range(n)],
        "query": [f"question {i}?" for i in range(n)],
        "expected_output": [f"answer {i}" for i in range(n)],
        "contexts": [
            [f"answer {i} is here" if rng.random() < 0.4 else f"other {i}.{j}" for j in range(5)]
            for i in range(n)
        ],
    }


def test_summary_rebuilt_later_shows_the_texts_a_json_lines_run_showed(tmp_path: Path) -> None:
    """A JSON Lines input is never read back; `ctxprec summary OUT` shows the same texts as the
    run's own page all the same (the report keeps the texts of the rows it opened), and after
    the input is gone too."""
    rows = _texts_log()
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(
            json.dumps(dict(zip(rows, values, strict=True))) + "\n"
            for values in zip(*rows.values(), strict=True)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert score(lines, "-o", out, "--batch-rows", "7") == 0
    page = (out / "summary.html").read_bytes()
    assert page.count(b"question ") >= 60
    lines.unlink()
    assert main(["summary", str(out)]) == 0
    assert (out / "summary.html").read_bytes() == page
    kept = json.loads((out / "_ctxprec" / "report-texts.json").read_text(encoding="utf-8"))
    assert len(kept["texts"]) == page.count(b'<details class="row"')


def test_an_extractor_runs_page_shows_the_items_it_made(tmp_path: Path) -> None:
    """With --extractor the items are made from each row: the run keeps them for its page (and
    for `ctxprec summary` later), as it does a context column's."""
    rows = _texts_log(40)
    blob = ["||".join(items) for items in rows.pop("contexts")]  # type: ignore[arg-type]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({**rows, "blob": blob}), src)
    module = tmp_path / "split_blob.py"
    module.write_text("def items(row):\n    return row['blob'].split('||')\n", encoding="utf-8")
    out = tmp_path / "out"
    assert score(src, "-o", out, "--extractor", f"{module}:items") == 0
    page = (out / "summary.html").read_text(encoding="utf-8")
    assert "Item texts are not in the output" not in page
    assert page.count("answer ") >= 20  # the items' own texts
    before = (out / "summary.html").read_bytes()
    assert main(["summary", str(out)]) == 0
    assert (out / "summary.html").read_bytes() == before
