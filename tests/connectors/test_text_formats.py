"""JSON Lines and CSV input: the same rows score exactly as Parquet (plain, gzip, zstd), batches
and keys match Parquet's (resume), mixed folders read every file, unknown files are named, and
bad text input gets one line saying what to do."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from ctxprec.cli.main import main
from ctxprec.connectors.sources import ColumnMap, inspect_source, iter_batches
from ctxprec.engines.dask import plan_tasks
from ctxprec.storage.core.errors import InputError
from tests.fakes.inputs import HOTPOT_COLUMNS, HOTPOT_MAP, SAMPLE


def rows(hotpot: Path, n: int = 60) -> pl.DataFrame:
    return pl.read_parquet(hotpot).head(n)


def write_jsonl(frame: pl.DataFrame, path: Path, codec: str | None = None) -> Path:
    text = frame.write_ndjson().encode()
    if codec == "gzip":
        path.write_bytes(gzip.compress(text))
    elif codec == "zstd":
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(text)
    else:
        path.write_bytes(text)
    return path


def write_csv(frame: pl.DataFrame, path: Path) -> Path:
    """CSV has no list type: list columns as JSON arrays, one per cell."""
    lists = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
    encoded = frame.with_columns(
        pl.col(c).map_elements(lambda v: json.dumps(v.to_list()), return_dtype=pl.String)
        for c in lists
    )
    encoded.write_csv(path)
    return path


def scored(src: Path | str, out: Path, *flags: str) -> pl.DataFrame:
    args = ["score", str(src), "-o", str(out), *HOTPOT_MAP, "--progress", "off", *flags]
    assert main(args) == 0
    return pl.read_parquet(out / "*.parquet").drop("scored_at").sort("id")


@pytest.mark.parametrize(
    "name",
    ["in.jsonl", "in.ndjson", "in.json", "in.jsonl.gz", "in.ndjson.zst", "in.csv", "in.csv.gz"],
)
def test_same_rows_score_exactly_as_parquet(hotpot: Path, tmp_path: Path, name: str) -> None:
    frame = rows(hotpot)
    frame.write_parquet(tmp_path / "in.parquet")
    path = tmp_path / name
    codec = {"gz": "gzip", "zst": "zstd"}.get(name.rsplit(".", 1)[-1])
    if ".csv" in name:
        plain = write_csv(frame, tmp_path / "plain.csv")
        if codec:
            path.write_bytes(gzip.compress(plain.read_bytes()))
            plain.unlink()
        else:
            plain.rename(path)
    else:
        write_jsonl(frame, path, codec)
    flags = ("--batch-rows", "7", "--map", "labels=labels", "--passthrough", "source")
    want = scored(tmp_path / "in.parquet", tmp_path / "from-parquet", *flags)
    got = scored(path, tmp_path / "from-text", *flags)
    assert got.height == 60
    assert got.equals(want)
    parts = sorted(p.name for p in (tmp_path / "from-text").glob("*.parquet"))
    assert parts == sorted(p.name for p in (tmp_path / "from-parquet").glob("*.parquet"))


def test_text_batches_have_parquets_keys_and_skip_done_parts(hotpot: Path, tmp_path: Path) -> None:
    path = write_jsonl(rows(hotpot, 23), tmp_path / "a.jsonl")
    info = inspect_source(str(path), HOTPOT_COLUMNS, use_extractor=False)
    assert info.total_rows == 23
    assert info.rows == (23,)
    keys = [
        (b.key, b.first_row, b.frame.height)
        for b in iter_batches(info, HOTPOT_COLUMNS, batch_rows=5)
    ]
    assert keys == [
        ("00000-00000", 0, 5),
        ("00000-00001", 5, 5),
        ("00000-00002", 10, 5),
        ("00000-00003", 15, 5),
        ("00000-00004", 20, 3),
    ]
    rest = list(
        iter_batches(info, HOTPOT_COLUMNS, batch_rows=5, skip={"00000-00000", "00000-00002"})
    )
    assert [(b.key, b.first_row) for b in rest] == [
        ("00000-00001", 5),
        ("00000-00003", 15),
        ("00000-00004", 20),
    ]
    whole = pl.concat([b.frame for b in iter_batches(info, HOTPOT_COLUMNS, batch_rows=5)])
    assert whole.get_column("id").to_list() == rows(hotpot, 23).get_column("id").to_list()
    assert (
        whole.get_column("context").to_list() == rows(hotpot, 23).get_column("contexts").to_list()
    )


def test_dask_cuts_a_big_jsonl_file_at_batch_boundaries(hotpot: Path, tmp_path: Path) -> None:
    import anyio

    from ctxprec.config import load_config
    from ctxprec.run.driver import prepare_run

    path = write_jsonl(rows(hotpot, 50), tmp_path / "a.jsonl.gz", "gzip")
    cfg = load_config(
        flags={
            "columns.query": "question",
            "columns.expected": "ground_truth",
            "run.batch_rows": 10,
        }
    )
    plan = anyio.run(prepare_run, str(path), tmp_path / "out", cfg)
    tasks = plan_tasks(plan, task_rows=20)
    assert [(t.first, t.stop, t.batches) for t in tasks] == [(0, 2, 5), (2, 4, 5), (4, 5, 5)]


def test_a_mixed_folder_reads_every_format_and_names_what_it_skips(
    hotpot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = rows(hotpot)
    src = tmp_path / "in"
    src.mkdir()
    frame.slice(0, 20).write_parquet(src / "a.parquet")
    write_jsonl(frame.slice(20, 20), src / "b.jsonl")
    write_csv(frame.slice(40, 20), src / "c.csv")
    (src / "notes.txt").write_text("about this export")
    (src / "_SUCCESS").write_text("")
    frame.write_parquet(tmp_path / "all.parquet")
    want = scored(tmp_path / "all.parquet", tmp_path / "one")
    capsys.readouterr()
    got = scored(src, tmp_path / "mixed")
    out, err = capsys.readouterr()
    assert got.height == 60
    assert got.get_column("id").is_unique().all()
    # one file vs three: other batches, so ndcg may differ in the last bit (float sums)
    assert_frame_equal(got, want)
    # one line names what was not read, with one count (_SUCCESS and notes.txt)
    said = [line for line in (out + err).splitlines() if "notes.txt" in line]
    assert said == [
        f"ctxprec: note: 2 file(s) in {src} were not read (1 hidden or starting with '_', 1 in "
        "no input format (Parquet, JSON Lines, CSV); e.g. _SUCCESS, notes.txt)"
    ]


def test_an_id_in_two_formats_is_a_duplicate(hotpot: Path, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    rows(hotpot, 10).write_parquet(src / "a.parquet")
    write_jsonl(rows(hotpot, 10).slice(9), src / "b.jsonl")
    with pytest.raises(InputError, match=r"duplicate id .*b.jsonl line 1\b"):
        inspect_source(str(src), HOTPOT_COLUMNS, use_extractor=False)


def test_csv_context_that_is_not_a_json_array_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('id,query,contexts\nr0,what?,"first passage|second"\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        inspect_source(str(path), ColumnMap(), use_extractor=False)
    text = str(err.value)
    assert "column `contexts` in" in text
    assert "row 1 is text, not a JSON array" in text  # the first data row, counted from 1
    assert "CSV has no list type" in text
    assert "--extractor" in text


def test_csv_with_an_extractor_needs_no_list_column(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('id,query,passages\nr0,what?,"a|b"\nr1,who?,"c"\n', encoding="utf-8")
    info = inspect_source(str(path), ColumnMap(context=None), use_extractor=True)
    batch = next(iter_batches(info, ColumnMap(context=None), batch_rows=10))
    assert batch.frame.get_column("source_row").to_list()[0]["passages"] == "a|b"


def test_bad_json_lines_name_the_file_and_rows(tmp_path: Path) -> None:
    array = tmp_path / "export.json"
    array.write_text('[{"id": "a", "query": "q", "contexts": ["x"]}]')
    with pytest.raises(InputError, match=r"holds a JSON array, not JSON Lines"):
        inspect_source(str(array), ColumnMap(), use_extractor=False)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "query": "q", "contexts": ["x"]}\n{"id": "b", "query": \n')
    with pytest.raises(InputError, match=r"broken.jsonl rows 1-2 are not valid JSON Lines"):
        inspect_source(str(broken), ColumnMap(), use_extractor=False)
    typed = tmp_path / "typed.jsonl"
    lines = [json.dumps({"id": i, "query": "q", "contexts": ["x"]}) for i in range(2_000)]
    lines.append(json.dumps({"id": "x", "query": "q", "contexts": ["x"]}))
    typed.write_text("\n".join(lines))
    with pytest.raises(
        InputError, match=r"column `id` \(id\) in .*typed.jsonl holds values of different"
    ):
        inspect_source(str(typed), ColumnMap(), use_extractor=False)


def test_jsonl_labels_and_timestamps_keep_their_meaning(tmp_path: Path) -> None:
    sample = pl.read_parquet(SAMPLE).with_columns(pl.lit("2026-11-28T10:00:00").alias("ts"))
    path = write_jsonl(sample, tmp_path / "s.jsonl")
    columns = ColumnMap(labels="labels", passthrough=("ts", "retriever"))
    info = inspect_source(str(path), columns, use_extractor=False)
    frame = next(iter_batches(info, columns, batch_rows=100)).frame
    assert frame.get_column("labels").to_list() == sample.get_column("labels").to_list()
    assert frame.get_column("ts").dtype == pl.String  # JSON has strings, not timestamps


def test_crlf_bom_and_empty_exports(tmp_path: Path) -> None:
    """Windows line ends and a UTF-8 BOM read as usual; an empty export adds no rows; an input
    of only empty exports is an empty dataset (as an empty Parquet is)."""
    sample = pl.read_parquet(SAMPLE)
    text = sample.write_ndjson()
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    (src / "idle-day.jsonl").write_text("\n")
    columns = ColumnMap(labels="labels")
    info = inspect_source(str(src), columns, use_extractor=False)
    assert info.rows == (12, 0)
    frame = pl.concat([b.frame for b in iter_batches(info, columns, batch_rows=5)])
    assert frame.get_column("id").to_list() == sample.get_column("id").to_list()
    assert frame.get_column("query").to_list() == sample.get_column("query").to_list()
    idle = inspect_source(str(src / "idle-day.jsonl"), columns, use_extractor=False)
    assert (idle.total_rows, idle.has_expected) == (0, True)
    assert list(iter_batches(idle, columns, batch_rows=5)) == []


EMPTY_INPUTS = {
    "empty.parquet": lambda p: pl.read_parquet(SAMPLE).head(0).write_parquet(p),
    "empty.jsonl": lambda p: p.write_bytes(b""),
    "blank-lines.jsonl": lambda p: p.write_text("\n\n"),
    "empty.csv": lambda p: p.write_bytes(b""),
    "header-only.csv": lambda p: p.write_text("id,query,expected_output,contexts\n"),
    "empty.jsonl.gz": lambda p: p.write_bytes(gzip.compress(b"")),
}


@pytest.mark.parametrize("name", sorted(EMPTY_INPUTS))
def test_every_empty_input_is_one_note_and_an_empty_dataset(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 0-byte JSON Lines export exited 2 where an empty Parquet gave a note
    src, out = tmp_path / name, tmp_path / "out"
    EMPTY_INPUTS[name](src)
    assert main(["score", str(src), "-o", str(out), "--progress", "off"]) == 0
    captured = capsys.readouterr()
    notes = [x for x in captured.out.splitlines() if x.startswith("ctxprec: note:")]
    assert notes == [
        f"ctxprec: note: the input {src} holds no rows; the output is an empty dataset"
    ]
    assert "WARNING" not in captured.out + captured.err
    scored = pl.read_parquet(out / "*.parquet")
    assert scored.height == 0
    reference = tmp_path / "ref"
    EMPTY_INPUTS["empty.parquet"](tmp_path / "ref.parquet")
    assert (
        main(["score", str(tmp_path / "ref.parquet"), "-o", str(reference), "--progress", "off"])
        == 0
    )
    assert scored.schema == pl.read_parquet(reference / "*.parquet").schema
