"""The shapes warehouses hold: retrieved documents as list<struct<doc_id, text, score>> (a field
mapped as the context with `--map context=retrieved_docs.text`, in config and in the Python
API; other fields copied with `--passthrough`), JSON Lines arrays of objects, and JSON arrays
stored as text in Parquet (as CSV holds them). Scores are those of the same rows given as
list<string>."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.config import load_config
from ctxprec.connectors.sources import ColumnMap, inspect_source, iter_batches
from ctxprec.engines.choice import score as api_score
from ctxprec.run.driver import RunOptions
from ctxprec.storage.core.errors import InputError
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.runs import score

DOC = pa.struct([("doc_id", pa.string()), ("text", pa.string()), ("score", pa.float64())])
TEXTS = [
    ["Hamlet was written by Shakespeare.", "Paris is large."],
    ["Paris is the capital of France.", "Hamlet is a play.", "Rain falls."],
    [],
]
EXPECTED = ["Shakespeare wrote Hamlet.", "Paris.", "Nothing."]


def docs() -> list[list[dict[str, object]]]:
    return [
        [{"doc_id": f"d{r}{k}", "text": t, "score": 1.0 - k / 10} for k, t in enumerate(texts)]
        for r, texts in enumerate(TEXTS)
    ]


def warehouse_export(path: Path) -> Path:
    """Rows as a warehouse or a tracing tool exports them: the retrieved documents as structs,
    a request struct, labels inside the documents."""
    labelled = [[{**d, "relevant": k == 0} for k, d in enumerate(row)] for row in docs()]
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "query": ["Who wrote Hamlet?", "What is the capital of France?", "Weather?"],
            "expected_output": EXPECTED,
            "retrieved_docs": pa.array(
                labelled, pa.list_(pa.struct([*DOC, ("relevant", pa.bool_())]))
            ),
            "meta": pa.array(
                [{"source": "web"}, {"source": "kb"}, {"source": None}],
                pa.struct([("source", pa.string())]),
            ),
        }
    )
    pq.write_table(table, path)
    return path


def plain_rows(path: Path) -> Path:
    pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "query": ["Who wrote Hamlet?", "What is the capital of France?", "Weather?"],
            "expected_output": EXPECTED,
            "contexts": TEXTS,
        },
        schema_overrides={"contexts": pl.List(pl.String)},
    ).write_parquet(path)
    return path


def scored(out: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in part_files(out)]).sort("id")


def test_a_struct_field_is_the_context_and_others_pass_through(tmp_path: Path) -> None:
    src, out = warehouse_export(tmp_path / "export.parquet"), tmp_path / "out"
    mapping = ["--map", "context=retrieved_docs.text,labels=retrieved_docs.relevant"]
    kept = ["--passthrough", "retrieved_docs.doc_id,meta.source=source"]
    assert score(src, "-o", out, *mapping, *kept) == 0
    assert score(plain_rows(tmp_path / "plain.parquet"), "-o", tmp_path / "plain") == 0
    got, plain = scored(out), scored(tmp_path / "plain")
    assert got["verdicts"].to_list() == plain["verdicts"].to_list()
    assert got["score"].to_list() == plain["score"].to_list()
    assert got["context_count"].to_list() == [2, 3, 0]
    assert got["retrieved_docs.doc_id"].to_list() == [["d00", "d01"], ["d10", "d11", "d12"], []]
    assert got["source"].to_list() == ["web", "kb", None]
    assert got["label_verdicts"].to_list() == [[True, False], [True, False, False], []]


def test_the_same_mapping_in_config_and_in_the_python_api(tmp_path: Path) -> None:
    src = warehouse_export(tmp_path / "export.parquet")
    config = tmp_path / "c.toml"
    config.write_text('[columns]\ncontext = "retrieved_docs.text"\n')
    assert score(src, "-o", tmp_path / "cli", "--config", config) == 0
    cfg = load_config(None, {"columns.context": "retrieved_docs.text"})
    result = api_score(str(src), str(tmp_path / "api"), cfg, RunOptions(progress="off"))
    assert result.failed == 0
    assert scored(tmp_path / "api")["verdicts"].equals(scored(tmp_path / "cli")["verdicts"])


def test_json_lines_arrays_of_objects(tmp_path: Path) -> None:
    src = tmp_path / "export.jsonl"
    rows = [
        {"id": rid, "query": q, "expected_output": e, "retrieved_docs": d}
        for rid, q, e, d in zip(
            ["a", "b", "c"], ["Who wrote Hamlet?", "Capital of France?", "?"], EXPECTED, docs(),
            strict=True,
        )
    ]  # fmt: skip
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    kept = ("--passthrough", "retrieved_docs.doc_id")
    assert score(src, "-o", out, "--map", "context=retrieved_docs.text", *kept) == 0
    got = scored(out)
    assert got["context_count"].to_list() == [2, 3, 0]
    assert got["retrieved_docs.doc_id"].to_list()[0] == ["d00", "d01"]


def test_what_a_struct_column_needs_is_said(tmp_path: Path) -> None:
    src = warehouse_export(tmp_path / "export.parquet")
    # not mapped at all: the likely field is suggested
    with pytest.raises(InputError, match=r"seems to hold these fields: --map context=retrieved_"):
        inspect_source(str(src), ColumnMap(), use_extractor=False)
    # the struct column itself: which field to map
    with pytest.raises(InputError, match=r"map the one that holds the context, e\.g\. --map "
                       r"context=retrieved_docs\.text"):  # fmt: skip
        inspect_source(str(src), ColumnMap(context="retrieved_docs"), use_extractor=False)
    # a field the structs lack: the fields they have
    with pytest.raises(InputError, match=r"no field `txt` \(their fields: doc_id, text, score"):
        inspect_source(str(src), ColumnMap(context="retrieved_docs.txt"), use_extractor=False)


def test_json_arrays_stored_as_text_in_parquet(tmp_path: Path) -> None:
    """As CSV holds them: decoded the whole batch at once; a row whose text is not a JSON array
    of strings fails alone, on its input."""
    src = tmp_path / "text.parquet"
    texts = [json.dumps(t) for t in TEXTS[:2]] + ["first passage | second"]
    pl.DataFrame(
        {"id": ["a", "b", "c"], "query": ["q1?", "q2?", "q3?"], "contexts": texts}
    ).write_parquet(src)
    info = inspect_source(str(src), ColumnMap(), use_extractor=False)
    assert info.encoded == ("contexts",)
    out = tmp_path / "out"
    assert score(src, "-o", out) == 1  # the third row's input is invalid
    got = scored(out)
    assert got["context_count"].to_list()[:2] == [2, 3]
    assert got["status"].to_list() == ["ok", "ok", "failed"]
    error = got["error"].to_list()[2]
    assert error.startswith("invalid_input: column `contexts` holds text that is not a JSON array")
    # the fast, columnar decoding gives the lists a list<string> column would
    good = tmp_path / "good.parquet"
    pl.DataFrame({"id": ["a", "b"], "query": ["q?", "q?"], "contexts": texts[:2]}).write_parquet(
        good
    )
    info = inspect_source(str(good), ColumnMap(), use_extractor=False)
    batch = next(iter_batches(info, ColumnMap(), batch_rows=10))
    assert batch.frame["context"].to_list() == TEXTS[:2]
