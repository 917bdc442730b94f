"""Bad input through the real CLI (`main([...])`) on real files: every up-front problem stops the
run with exit 2 and a message naming the file / column / row id and what to do, before the first
judge call (the HTTP cases point OPENAI_BASE_URL at a loopback fake and prove it saw nothing);
row-level problems become row statuses while the other rows of the same file are scored.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import KEY, REPO
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread
from tests.fakes.runs import score

HTTP = ("--model", "openai/judge-1")


def data(rows: int = 3, **overrides: Any) -> dict[str, Any]:
    """Columns of a valid input (id, query, contexts), replaced or added by `overrides`."""
    cols: dict[str, Any] = {
        "id": [f"r{i}" for i in range(rows)],
        "query": [f"question {i}?" for i in range(rows)],
        "contexts": [[f"passage {i}", "another passage"] for i in range(rows)],
    }
    cols.update(overrides)
    return cols


def write(path: Path, rows: int = 3, **overrides: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data(rows, **overrides)), path)
    return path


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err
    assert "internal error" not in err, err


def read(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "*.parquet").sort("id")


# ---------------------------------------------------------------- up-front errors, table-driven


# A builder makes the input in tmp_path and returns (input, extra args, expected fragments of
# the message); "{in}" in a fragment stands for the input path.
Built = tuple[Path | str, list[str], list[str]]


def _missing_file(tmp: Path) -> Built:
    path = tmp / "nope.parquet"
    return path, [], ["input {in} does not exist", "give a Parquet, JSON Lines or CSV file"]


def _csv(tmp: Path) -> Built:
    path = tmp / "logs.parquet"
    path.write_text("id,query,contexts\nr0,what?,a|b\n", encoding="utf-8")
    return path, [], ["{in} is not a Parquet file", "convert it to Parquet"]


def _truncated(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", rows=50)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path, [], ["{in} is a corrupt or truncated Parquet file", "re-export it"]


def _bad_footer(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", rows=50)
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - footer
    raw[start : start + footer] = b"\xee" * footer  # metadata garbage, magic bytes intact
    path.write_bytes(bytes(raw))
    return path, [], ["{in} is a corrupt or truncated Parquet file", "re-export it"]


def _zero_bytes(tmp: Path) -> Built:
    path = tmp / "in.parquet"
    path.write_bytes(b"")
    return path, [], ["{in} is empty (0 bytes)", "re-export or remove it"]


def _no_query(tmp: Path) -> Built:
    cols = data()
    del cols["query"]
    path = tmp / "in.parquet"
    pq.write_table(pa.table(cols), path)
    return path, [], ["column `query` is missing in {in}", "--map query=COLUMN"]


def _mapped_missing(tmp: Path) -> Built:
    path = write(tmp / "in.parquet")
    return (
        path,
        ["--map", "query=question"],
        ["column `question` is missing in {in}", "columns: id, query, contexts", "--map query="],
    )


def _no_contexts(tmp: Path) -> Built:
    cols = data()
    del cols["contexts"]
    path = tmp / "in.parquet"
    pq.write_table(pa.table(cols), path)
    return path, [], ["column `contexts` is missing in {in}", "--extractor module:function"]


def _expected_missing(tmp: Path) -> Built:
    path = write(tmp / "in.parquet")
    return path, ["--map", "expected=ground_truth"], ["column `ground_truth` is missing in {in}"]


def _int_query(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", query=[1, 2, 3])
    return (
        path,
        [],
        ["column `query` (query) in {in} has type int64", "must be a string column", "convert it"],
    )


def _int_items(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", contexts=[[1, 2], [3], []])
    return (
        path,
        [],
        [
            "column `contexts` (context) in {in} has type list<element: int64>",
            "cast them to string",
        ],
    )


def _string_contexts(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", contexts=["a. b.", "c.", "d."])
    return (
        path,
        [],
        ["column `contexts` (context) in {in} has type string", "store the items as list<string>"],
    )


def _binary_query(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", query=pa.array([b"a", b"b", b"c"], pa.binary()))
    return path, [], ["column `query` (query) in {in} has type binary", "decode the bytes to UTF-8"]


def _float_ids(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", id=[0.5, 1.5, 2.5])
    return path, [], ["column `id` (id) in {in} has type double", "string or integer column"]


def _null_id(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", id=["r0", None, "r2"])
    return path, [], ["column `id` (id) is null in {in} row 2", "every row needs an id"]


def _duplicate_ids(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", id=["r0", "r1", "r0"])
    return (
        path,
        [],
        ["duplicate id 'r0' in column `id`", "{in} row 1;", "{in} row 3", "deduplicate the data"],
    )


def _duplicate_across_files(tmp: Path) -> Built:
    write(tmp / "in" / "a.parquet")
    write(tmp / "in" / "b.parquet", id=["r9", "r2", "r8"])
    return tmp / "in", [], ["duplicate id 'r2'", "a.parquet row 3", "b.parquet row 2"]


def _non_utf8_id(tmp: Path) -> Built:
    ids = pa.array([b"r0", b"r\xff1", b"r2"], pa.binary()).view(pa.string())
    path = write(tmp / "in.parquet", id=ids)
    return path, [], ["cannot read the id column `id` of {in}", "UTF-8", "--map id=COLUMN"]


def _passthrough_missing(tmp: Path) -> Built:
    path = write(tmp / "in.parquet")
    return (
        path,
        ["--passthrough", "retriever"],
        ["column `retriever` is missing in {in}", "remove it from passthrough"],
    )


def _passthrough_output_name(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", score=[1.0, 2.0, 3.0])
    return (
        path,
        ["--passthrough", "score"],
        ["passthrough column `score` has the name of an output column", "rename it"],
    )


def _glob_nothing(tmp: Path) -> Built:
    write(tmp / "in" / "a.parquet")
    pattern = str(tmp / "in" / "*.parq")
    return pattern, [], [f"glob `{pattern}` matched no input files", "check the pattern"]


def _folder_without_parquet(tmp: Path) -> Built:
    folder = tmp / "in"
    folder.mkdir()
    (folder / "notes.txt").write_text("id\n1\n", encoding="utf-8")
    write(folder / "_hidden.parquet")
    return folder, [], ["folder {in} holds no input files", "in no input format: ", "notes.txt"]


def _schema_mismatch(tmp: Path) -> Built:
    write(tmp / "in" / "a.parquet")
    write(tmp / "in" / "b.parquet", id=["x0", "x1", "x2"], query=[1, 2, 3])
    return (
        tmp / "in",
        [],
        ["column `query` (query) in {in}/b.parquet has type int64", "must be a string column"],
    )


def _column_only_in_one_file(tmp: Path) -> Built:
    write(tmp / "in" / "a.parquet", expected_output=["x", "y", "z"])
    write(tmp / "in" / "b.parquet", id=["x0", "x1", "x2"])
    return (
        tmp / "in",
        [],
        [
            "column `expected_output` is in {in}/a.parquet but not in {in}/b.parquet",
            "score the two groups of files separately",
        ],
    )


def _id_type_mismatch(tmp: Path) -> Built:
    write(tmp / "in" / "a.parquet")
    write(tmp / "in" / "b.parquet", id=[7, 8, 9])
    return (
        tmp / "in",
        [],
        ["column `id` is string in {in}/a.parquet but int64 in {in}/b.parquet", "rewrite one"],
    )


def _hive_levels_differ(tmp: Path) -> Built:
    write(tmp / "in" / "dt=1" / "a.parquet")
    write(tmp / "in" / "b.parquet", id=["x0", "x1", "x2"])
    return tmp / "in", [], ["Hive partition folders differ", "the same folder levels"]


def _labels_wrong_type(tmp: Path) -> Built:
    path = write(tmp / "in.parquet", labels=[[1, 0], [0, 1], [1, 1]])
    return (
        path,
        ["--map", "labels=labels"],
        ["column `labels` (labels) in {in} has type list<element: int64>", "list<bool>"],
    )


INPUT_CASES: dict[str, Callable[[Path], Built]] = {
    "missing_file": _missing_file,
    "csv_named_parquet": _csv,
    "truncated_parquet": _truncated,
    "corrupt_footer": _bad_footer,
    "zero_byte_file": _zero_bytes,
    "missing_default_query_column": _no_query,
    "missing_column_mapped_with_map": _mapped_missing,
    "missing_context_column": _no_contexts,
    "missing_explicit_expected_column": _expected_missing,
    "int_query": _int_query,
    "list_of_int_contexts": _int_items,
    "string_contexts": _string_contexts,
    "binary_query": _binary_query,
    "float_ids": _float_ids,
    "null_id": _null_id,
    "duplicate_ids": _duplicate_ids,
    "duplicate_ids_across_files": _duplicate_across_files,
    "non_utf8_id": _non_utf8_id,
    "passthrough_column_missing": _passthrough_missing,
    "passthrough_named_like_output": _passthrough_output_name,
    "glob_matching_nothing": _glob_nothing,
    "folder_without_parquet": _folder_without_parquet,
    "schema_mismatch_between_files": _schema_mismatch,
    "column_in_one_file_only": _column_only_in_one_file,
    "id_type_differs_between_files": _id_type_mismatch,
    "hive_levels_differ": _hive_levels_differ,
    "labels_wrong_type": _labels_wrong_type,
}


def refused(
    capsys: pytest.CaptureFixture[str],
    fake: FakeJudgeServer,
    args: list[Any],
    fragments: list[str],
    *,
    model: tuple[str, ...] = HTTP,
) -> str:
    """Exit 2, the fake judge saw no request, every fragment is on stderr, no traceback."""
    code = score(*args, *model)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert fake.stats.total == 0
    no_traceback(err)
    assert err.startswith("ctxprec: error: "), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert out == ""
    return err


@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_bad_input_stops_before_any_judge_call(
    name: str, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, extra, fragments = INPUT_CASES[name](tmp_path)
    out = tmp_path / "out"
    wanted = [f.replace("{in}", str(source)) for f in fragments]
    refused(capsys, fake, [source, "-o", out, *extra], wanted)
    assert not (out / "_SUCCESS").exists()
    assert not list(out.glob("*.parquet"))


# ---------------------------------------------------------------- judge, config and flags


BAD_FLAGS: dict[str, tuple[list[str], list[str]]] = {
    "unknown_provider": (
        ["--model", "foo/bar"],
        [
            "unknown judge provider 'foo' in model 'foo/bar'",
            "all known: anthropic, azure,",
            "offline",
        ],
    ),
    "model_without_name": (
        ["--model", "openai"],
        ["model 'openai' names no model", "openai/<model-name>"],
    ),
    "overwrite_and_incremental": (
        ["--overwrite", "--incremental"],
        ["--overwrite and --incremental contradict each other; pick one"],
    ),
    "map_without_equals": (["--map", "query"], ["--map 'query': write FIELD=COLUMN"]),
    "map_unknown_field": (
        ["--map", "question=q"],
        ["--map 'question=q'", "FIELD one of context, expected, id, labels, query"],
    ),
    "map_empty_column": (["--map", "query="], ["--map 'query='", "write FIELD=COLUMN"]),
    "concurrency_zero": (
        ["--concurrency", "0"],
        ["--concurrency must be at least 1, got 0"],
    ),
    "negative_scale": (
        ["--scale", "-1"],
        ["--scale must be zero or more, got -1.0"],
    ),
    "batch_rows_zero": (["--batch-rows", "0"], ["--batch-rows must be at least 1"]),
    "rpm_zero": (["--rpm", "0"], ["--rpm must be a positive number"]),
    "ks_zero": (["--ks", "0,3"], ["--ks must be a list of whole numbers"]),
    "timeout_zero": (
        ["--timeout", "0"],
        ["--timeout must be a positive number of seconds, got 0.0"],
    ),
    "negative_retries": (
        ["--max-retries", "-1"],
        ["--max-retries must be 0 or more, got -1"],
    ),
    "scheduler_without_dask": (
        ["--scheduler", "tcp://127.0.0.1:9"],
        ["--scheduler and --workers are for --engine dask; add it"],
    ),
    "workers_without_dask": (["--workers", "2"], ["--scheduler and --workers are for --engine"]),
    "extractor_without_colon": (
        ["--extractor", "just_a_module"],
        ['--extractor must be "module:function"'],
    ),
    "extractor_not_importable": (
        ["--extractor", "no_such_module_ctxprec:split"],
        ["context extractor 'no_such_module_ctxprec:split' cannot be loaded", "PYTHONPATH"],
    ),
    "extractor_not_callable": (
        ["--extractor", "json:__doc__"],
        ["context extractor 'json:__doc__' is not callable", "returns its context items"],
    ),
}


@pytest.mark.parametrize("name", list(BAD_FLAGS))
def test_bad_flags_stop_before_any_judge_call(
    name: str, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, fragments = BAD_FLAGS[name]
    source = write(tmp_path / "in.parquet")
    model = () if "--model" in flags else HTTP
    refused(capsys, fake, [source, "-o", tmp_path / "out", *flags], fragments, model=model)
    assert not (tmp_path / "out").exists()


def test_quiet_with_a_progress_bar_is_refused(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet")
    args = ["score", str(source), "-o", str(tmp_path / "out"), *HTTP, "--quiet", "--progress"]
    assert main([*args, "bar"]) == 2
    err = capsys.readouterr().err
    assert "--quiet and --progress bar contradict each other" in err
    no_traceback(err)
    assert fake.stats.total == 0


def test_flag_of_the_wrong_kind_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet")
    with pytest.raises(SystemExit) as exited:
        main(["score", str(source), "-o", str(tmp_path / "out"), "--concurrency", "many"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --concurrency: invalid int value: 'many'" in err
    assert "usage: ctxprec score" in err
    no_traceback(err)


def test_missing_api_key_for_a_remote_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://judge.example.invalid/v1")
    source = write(tmp_path / "in.parquet")
    assert score(source, "-o", tmp_path / "out", *HTTP) == 2
    err = capsys.readouterr().err
    assert "judge openai/judge-1 needs an API key: set the environment variable OPENAI_API_KEY" in (
        err
    )
    no_traceback(err)
    assert not (tmp_path / "out").exists()


def test_missing_key_in_a_named_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CTXPREC_TEST_JUDGE_KEY", raising=False)
    source = write(tmp_path / "in.parquet")
    args = ["--base-url", "https://judge.example.invalid/v1", "--api-key-env"]
    assert score(source, "-o", tmp_path / "out", *HTTP, *args, "CTXPREC_TEST_JUDGE_KEY") == 2
    err = capsys.readouterr().err
    assert "set the environment variable CTXPREC_TEST_JUDGE_KEY" in err
    no_traceback(err)


def test_bad_environment_value(
    tmp_path: Path,
    fake: FakeJudgeServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CTXPREC_CONCURRENCY", "lots")
    source = write(tmp_path / "in.parquet")
    fragments = ["CTXPREC_CONCURRENCY (environment) must be a whole number, got 'lots'"]
    refused(capsys, fake, [source, "-o", tmp_path / "out"], fragments)


CONFIGS: dict[str, tuple[str | None, list[str]]] = {
    "invalid_toml": ('[judge]\nmodel = "openai/judge-1\n', ["is not valid TOML"]),
    "unknown_key": (
        '[judge]\nmodle = "openai/judge-1"\n',
        ["unknown setting(s) judge.modle", "known sections: [judge]"],
    ),
    "unknown_section": ("[juge]\nmodel = 1\n", ["unknown setting(s) juge.model"]),
    "wrong_type": (
        '[limits]\nconcurrency = "many"\n',
        ["[limits] concurrency in {cfg} must be a whole number, got 'many'"],
    ),
    "wrong_value": ('[judge]\nmode = "batch"\n', ['[judge] mode in {cfg} must be "item"']),
    "float_for_int": ("[run]\nbatch_rows = 2.5\n", ["[run] batch_rows in {cfg} must be a whole"]),
    "bad_prices": (
        '[prices."openai/judge-1"]\ninput_per_mtok = "cheap"\n',
        ['[prices."openai/judge-1"] in {cfg} needs input_per_mtok and output_per_mtok'],
    ),
    "not_utf8": (None, ["config file {cfg} is not valid TOML"]),
    "missing_file": ("", ["config file {cfg} does not exist", "ctxprec config NAME > my.toml"]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bad_config_file(
    name: str, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    body, fragments = CONFIGS[name]
    cfg = tmp_path / "run.toml"
    if body is None:
        cfg.write_bytes(b'[judge]\nmodel = "\xff\xfe"\n')
    elif body:
        cfg.write_text(body, encoding="utf-8")
    source = write(tmp_path / "in.parquet")
    wanted = [f.replace("{cfg}", str(cfg)) for f in fragments]
    refused(capsys, fake, [source, "-o", tmp_path / "out", "--config", cfg], wanted)


def test_cache_dir_that_is_a_file(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "memo"
    cache.write_text("not a folder", encoding="utf-8")
    source = write(tmp_path / "in.parquet")
    fragments = [f"--cache-dir is {cache}, a file, not a folder", "--no-memo"]
    refused(capsys, fake, [source, "-o", tmp_path / "out", "--cache-dir", cache], fragments)


def test_estimate_reports_bad_input_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet", query=[1, 2, 3])
    assert main(["estimate", str(source)]) == 2
    err = capsys.readouterr().err
    assert f"column `query` (query) in {source} has type int64" in err
    no_traceback(err)


def test_summary_of_a_folder_that_holds_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["summary", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds no ctxprec run" in err
    assert "pass an OUTDIR written by `ctxprec score`" in err
    no_traceback(err)


def test_group_by_a_column_that_is_not_in_the_output(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet")
    fragments = ["--group-by nosuch: `nosuch` is neither an output column nor a column of"]
    refused(capsys, fake, [source, "-o", tmp_path / "out", "--group-by", "nosuch"], fragments)


def test_partition_by_a_column_that_is_not_in_the_output(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet")
    fragments = ["nosuch", "--passthrough"]
    refused(capsys, fake, [source, "-o", tmp_path / "out", "--partition-by", "nosuch"], fragments)


@pytest.mark.parametrize("column", ["../escape", "/abs/olute", "a/b", "..", "k=v"])
def test_partition_by_a_column_name_that_would_leave_outdir(
    column: str, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The name becomes the folder `COL=value/`; `../escape` wrote parts
    beside OUTDIR and reported 0 rows with exit 0. Refused before any call, nothing written."""
    source = tmp_path / "in" / "in.parquet"
    table = pa.table(data(3))
    write_to = source.parent
    write_to.mkdir()
    pq.write_table(table.append_column(column, pa.array(["x"] * 3)), source)
    args = [source, "-o", tmp_path / "out", "--passthrough", column, "--partition-by", column]
    refused(capsys, fake, args, ["--partition-by", "can name a folder inside OUTDIR"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def corrupt_second_row_group(source: Path) -> bytes:
    """40 rows in two row groups; the second group's context pages overwritten (footer fine).
    Returns the good bytes."""
    table = pa.table(data(40, contexts=[[f"passage {i} " * 20, "x"] for i in range(40)]))
    pq.write_table(table, source, row_group_size=20, compression="snappy")
    good = source.read_bytes()
    chunk = pq.ParquetFile(source).metadata.row_group(1).column(2)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    end = start + chunk.total_compressed_size
    source.write_bytes(good[: start + 10] + b"\x13" * (end - start - 10) + good[end:])
    return good


def committed_files(out: Path) -> set[str]:
    records = (json.loads(p.read_text()) for p in (out / "_ctxprec" / "parts").glob("*.json"))
    return {f for record in records for f in record["files"]}


def test_corrupt_data_page_stops_the_run_with_a_one_line_message(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only seen when the pages are read, mid-run: exit 2 naming the file and the row, no
    torn part file; once the file is fixed the same folder finishes (--overwrite)."""
    source, out = tmp_path / "in.parquet", tmp_path / "out"
    good = corrupt_second_row_group(source)
    assert score(source, "-o", out, *HTTP, "--batch-rows", "20") == 2
    err = capsys.readouterr().err
    no_traceback(err)
    assert f"ctxprec: error: cannot read {source} after row 20" in err
    assert "the file is corrupt: re-export it or leave it out of the input" in err
    assert err.count("\n") == 1  # one line, whatever Arrow's message holds
    written = {p.relative_to(out).as_posix() for p in out.glob("*.parquet")}
    assert written <= committed_files(out)
    source.write_bytes(good)
    assert score(source, "-o", out, *HTTP, "--batch-rows", "20", "--overwrite") == 0
    assert set(statuses(out).values()) == {("ok", None)}
    assert len(statuses(out)) == 40


def test_rows_read_before_a_corrupt_page_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, out = tmp_path / "in.parquet", tmp_path / "out"
    corrupt_second_row_group(source)
    with FakeJudgeThread(FakeJudgeConfig(latency_ms=50)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        assert score(source, "-o", out, *HTTP, "--batch-rows", "20") == 2
    assert sorted(statuses(out)) == sorted(f"r{i}" for i in range(20))


# ---------------------------------------------------------------- the output folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_output_folder_holding_another_run_loses_nothing(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out"
    assert score(source, "-o", out) == 0  # an offline run first
    before = _snapshot(out)
    capsys.readouterr()
    fragments = [
        f"output folder {out} holds another run",
        "--model: 'offline' there, 'openai/judge-1' here",
        "use a new folder, or --overwrite to replace it",  # another judge: not --incremental
    ]
    err = refused(capsys, fake, [source, "-o", out], fragments)
    assert "--incremental to add" not in err
    assert _snapshot(out) == before


def test_output_path_that_is_a_file(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out.txt"
    out.write_text("keep me", encoding="utf-8")
    fragments = [f"output {out} is a file, not a folder; pass a folder path"]
    refused(capsys, fake, [source, "-o", out], fragments)
    assert out.read_text(encoding="utf-8") == "keep me"


@pytest.mark.parametrize("flag", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_output_folder_with_foreign_files(
    flag: list[str], tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    fragments = [f"output folder {out} holds files ctxprec did not write (notes.txt)", "new"]
    refused(capsys, fake, [source, "-o", out, *flag], fragments)
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_output_folder_with_a_damaged_manifest(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out"
    assert score(source, "-o", out, *HTTP) == 0
    calls = fake.stats.total
    manifest = out / "_ctxprec" / "manifest.json"
    manifest.write_text("{not json", encoding="utf-8")
    capsys.readouterr()
    assert score(source, "-o", out, *HTTP) == 2
    err = capsys.readouterr().err
    assert f"{manifest} is damaged (not JSON); nothing was changed" in err
    assert "--overwrite" in err
    assert (out / "_SUCCESS").is_file()  # a finished output still reads as finished
    no_traceback(err)
    assert fake.stats.total == calls
    assert read(out).height == 3  # the scored rows are still there


def test_output_folder_inside_the_input_folder_is_not_read_as_input(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs"
    write(folder / "a.parquet")
    out = folder / "scored"
    assert score(folder, "-o", out, *HTTP) == 0
    calls = fake.stats.total
    assert score(folder, "-o", out, *HTTP) == 0  # the same command again: nothing to do
    no_traceback(capsys.readouterr().err)
    assert fake.stats.total == calls
    run = json.loads((out / "_ctxprec" / "run.json").read_text(encoding="utf-8"))
    assert run["rows_this_run"] == 0
    assert read(out).height == 3


@pytest.mark.parametrize(
    "flags", [["--map", "id=query"], ["--passthrough", "query"]], ids=["id_is_query", "query"]
)
def test_passthrough_of_a_mapped_text_column(
    flags: list[str], tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The source column that is also the query is copied to the output, not a crash."""
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out"
    assert score(source, "-o", out, *HTTP, *flags) == 0
    no_traceback(capsys.readouterr().err)
    df = read(out)
    assert df.get_column("query").to_list() == ["question 0?", "question 1?", "question 2?"]
    assert set(df.get_column("status")) == {"ok"}


# ---------------------------------------------------------------- row-level problems


def statuses(out: Path) -> dict[str, tuple[str, str | None]]:
    df = read(out)
    return {r["id"]: (r["status"], r["error"]) for r in df.iter_rows(named=True)}


def scored_ok(rows: dict[str, tuple[str, str | None]], *ids: str) -> None:
    for key in ids:
        assert rows[key] == ("ok", None), (key, rows[key])


def row_level(
    capsys: pytest.CaptureFixture[str], source: Path, out: Path, code: int, *extra: str
) -> dict[str, tuple[str, str | None]]:
    assert score(source, "-o", out, *HTTP, *extra) == code
    captured = capsys.readouterr()
    no_traceback(captured.err)
    assert (out / "_SUCCESS").exists()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rows = statuses(out)
    assert summary["rows"]["total"] == len(rows)
    if code == 1:  # input failures are not offered a retry; judge failures are
        input_causes = ("invalid_input", "extractor_error")  # the extractor is the user's too
        bad_input = any((e or "").startswith(input_causes) for _, e in rows.values())
        judge = any(s == "failed" and not (e or "").startswith(input_causes)
                    for s, e in rows.values())  # fmt: skip
        assert bad_input == ("a re-run cannot fix them: fix the input rows" in captured.out)
        assert judge == ("re-run the same command to retry only them" in captured.out)
    return rows


def test_null_query_fails_only_that_row(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write(tmp_path / "in.parquet", query=["q0?", None, "q2?"])
    rows = row_level(capsys, source, tmp_path / "out", 1)
    assert rows["r1"] == ("failed", "invalid_input: query is null")
    scored_ok(rows, "r0", "r2")
    assert fake.stats.total == 4  # two items for each good row, none for r1


@pytest.mark.parametrize("empty", [None, []], ids=["null_list", "empty_list"])
def test_null_or_empty_context_list_is_empty_context(
    empty: list[str] | None,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    contexts = pa.array([["a", "b"], empty, ["c"]], pa.list_(pa.string()))
    rows = row_level(capsys, write(tmp_path / "in.parquet", contexts=contexts), tmp_path / "o", 0)
    assert rows["r1"] == ("empty_context", None)
    scored_ok(rows, "r0", "r2")
    df = read(tmp_path / "o").filter(pl.col("id") == "r1")
    assert df.get_column("score").to_list() == [0.0]


def test_null_context_item_fails_only_that_row(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    contexts = pa.array([["a", "b"], ["c", None], ["d"]], pa.list_(pa.string()))
    rows = row_level(capsys, write(tmp_path / "in.parquet", contexts=contexts), tmp_path / "o", 1)
    assert rows["r1"] == ("failed", "invalid_input: context item #2 is null")
    scored_ok(rows, "r0", "r2")
    assert "c" not in fake.stats.items  # a failed row sends none of its items


def test_one_megabyte_item_fails_only_that_row(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    big = "x" * 1_000_000
    contexts = [["a", "b"], ["short", big], ["d"]]
    rows = row_level(capsys, write(tmp_path / "in.parquet", contexts=contexts), tmp_path / "o", 1)
    status, error = rows["r1"]
    assert status == "failed"
    assert error == (
        "invalid_input: context item #2 has 1,000,000 characters, over the limit of "
        "200,000 ([run] max_item_chars); trim it or raise the limit"
    )
    scored_ok(rows, "r0", "r2")
    assert big not in fake.stats.items
    assert "short" not in fake.stats.items


def _bad_query() -> dict[str, Any]:
    return {"query": ["q0?", None, "q2?"], "contexts": [["a", "b"], ["c", "d", "e"], ["f"]]}


def _bad_item() -> dict[str, Any]:
    return {"contexts": pa.array([["a", "b"], ["c", None, "e"], ["d"]], pa.list_(pa.string()))}


def _long_item() -> dict[str, Any]:
    return {"contexts": [["a", "b"], ["short", "x" * 300_000, "y"], ["d"]]}


def _bad_text() -> dict[str, Any]:
    queries = pa.array([b"q0?", b"q\xff\xfe1?", b"q2?"], pa.binary()).view(pa.string())
    return {"query": queries, "contexts": [["a"], ["b", "c", "e"], ["d"]]}


@pytest.mark.parametrize(
    "bad", [_bad_query, _bad_item, _long_item, _bad_text], ids=lambda f: f.__name__[1:]
)
def test_a_row_failed_on_input_counts_the_items_it_had(
    bad: Any, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """context_count is what the row holds, judged or not: a row that failed on input had
    its items (its error says which one is wrong), not none."""
    source = write(tmp_path / "in.parquet", **bad())
    rows = row_level(capsys, source, tmp_path / "o", 1)
    assert rows["r1"][0] == "failed"
    counts = dict(read(tmp_path / "o").select("id", "context_count").iter_rows())
    assert counts["r1"] == 3
    assert counts["r2"] == 1


def test_non_utf8_text_fails_only_that_row(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    queries = pa.array([b"q0?", b"q\xff\xfe1?", b"q2?"], pa.binary()).view(pa.string())
    rows = row_level(capsys, write(tmp_path / "in.parquet", query=queries), tmp_path / "o", 1)
    status, error = rows["r1"]
    assert status == "failed"
    assert error is not None
    assert error.startswith("invalid_input: column `query`")
    assert "UTF-8" in error
    scored_ok(rows, "r0", "r2")


def test_non_utf8_context_item_fails_only_that_row(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    items = pa.array([[b"a"], [b"b", b"\xc3("], [b"d"]], pa.list_(pa.binary()))
    contexts = items.view(pa.list_(pa.string()))
    rows = row_level(capsys, write(tmp_path / "in.parquet", contexts=contexts), tmp_path / "o", 1)
    status, error = rows["r1"]
    assert status == "failed"
    assert error is not None
    assert error.startswith("invalid_input: column `contexts`")
    scored_ok(rows, "r0", "r2")


_counter = itertools.count()

EXTRACTORS = """
def split(row):
    if row["id"] == "r1":
        raise ValueError("no passages in row r1")
    return row["text"].split("|")


def numbers(row):
    return [1, 2] if row["id"] == "r1" else row["text"].split("|")


def whole_text(row):
    return row["text"] if row["id"] == "r1" else row["text"].split("|")
"""


@pytest.fixture
def extractor_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"ctxprec_bad_input_ext_{next(_counter)}"
    folder = tmp_path / "ext"
    folder.mkdir()
    (folder / f"{name}.py").write_text(EXTRACTORS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("split", "extractor_error: ValueError: no passages in row r1"),
        ("numbers", "invalid_input: context item #1 is int, not a string"),
        ("whole_text", "invalid_input: context is str, not a list of strings"),
    ],
    ids=["raises", "returns_ints", "returns_a_string"],
)
def test_extractor_problems_fail_only_that_row(
    function: str,
    error: str,
    extractor_module: str,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    texts = {"text": ["a|b", "c|d", "e"]}
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": ["r0", "r1", "r2"], "query": ["q0", "q1", "q2"], **texts}), source
    )
    extra = ("--extractor", f"{extractor_module}:{function}")
    rows = row_level(capsys, source, tmp_path / "o", 1, *extra)
    assert rows["r1"] == ("failed", error)
    scored_ok(rows, "r0", "r2")
    assert fake.stats.total == 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_base_url_says_so_and_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead base URL: one line naming it at the first connection error, then, once the retry
    budget ends with no call ever answered, exit 4 with the way out; no row fails for it."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # loopback: no key needed
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    source, out = write(tmp_path / "in.parquet"), tmp_path / "out"
    code = score(source, "-o", out, *HTTP, "--retry-budget", "0", "--timeout", "2")  # no waits
    captured = capsys.readouterr()
    assert code == 4
    no_traceback(captured.err)
    said = [line for line in captured.err.splitlines() if "cannot be reached (" in line]
    assert len(said) == 1  # one line, not one per row or retry
    assert f"the judge at {url}/chat/completions cannot be reached" in said[0]
    assert "keeps retrying until the retry budget of 0 s ends, then stops (exit 4)" in said[0]
    assert "Ctrl-C" in said[0]
    assert "ctxprec: the judge cannot be reached:" in captured.err
    assert "Fix: check the base URL" in captured.err
    assert "rows failed" not in captured.out + captured.err
    assert not list(out.glob("*.parquet"))  # nothing committed as failed


def zero_rows(tmp_path: Path) -> Path:
    empty = {
        "id": pa.array([], pa.string()),
        "query": pa.array([], pa.string()),
        "contexts": pa.array([], pa.list_(pa.string())),
    }
    return write(tmp_path / "in.parquet", rows=0, **empty)


def test_zero_row_file_finishes_with_an_empty_summary(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert score(zero_rows(tmp_path), "-o", out, *HTTP) == 0
    captured = capsys.readouterr()
    no_traceback(captured.err)
    assert "0 rows" in captured.out
    assert fake.stats.total == 0
    assert (out / "_SUCCESS").exists()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["rows"]["total"] == 0
    assert (out / "summary.md").read_text(encoding="utf-8").strip()


def test_zero_row_file_writes_an_empty_table_in_the_output_schema(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    out = tmp_path / "out"
    assert score(zero_rows(tmp_path), "-o", out, *HTTP) == 0
    parts = sorted(out.glob("*.parquet"))
    assert parts, "no Parquet file in the output folder"
    table = pa.concat_tables(pq.read_table(p) for p in parts)
    assert table.num_rows == 0
    assert {"id", "score", "status", "error", "verdicts"} <= set(table.column_names)


# ---------------------------------------------------------------- output and sink mistakes


# A builder prepares tmp_path and returns (score args after the input, expected fragments of
# the message); every case exits 2 (never 3) before any judge call and changes no file.
OutBuilt = tuple[list[Any], list[str]]


def _object_store(tmp: Path) -> OutBuilt:
    return ["-o", "hdfs://nn/scores"], ["hdfs:// is not a storage ctxprec writes to"]


def _spark_folder(tmp: Path) -> OutBuilt:
    out = tmp / "out"
    (out / "dt=2024-01-01").mkdir(parents=True)
    (out / "_SUCCESS").write_bytes(b"")
    (out / "dt=2024-01-01" / "events.parquet").write_bytes(b"PAR1")
    return ["-o", out], [f"output folder {out} holds files ctxprec did not write", "_SUCCESS"]


def _hidden_only(tmp: Path) -> OutBuilt:
    (tmp / "out" / ".hidden").mkdir(parents=True)
    (tmp / "out" / ".hidden" / "x.parquet").write_bytes(b"PAR1")
    return ["-o", tmp / "out", "--overwrite"], [".hidden/x.parquet", "choose a new or empty"]


def _unknown_sink(tmp: Path) -> OutBuilt:
    return ["-o", tmp / "out", "--sink", "bigquery:x"], ["unknown sink kind 'bigquery'"]


def _duckdb_bad_table(tmp: Path) -> OutBuilt:
    sink = f"duckdb:{tmp}/w.duckdb:bad-name"
    return ["-o", tmp / "out", "--sink", sink], ["is not a plain identifier"]


def _delta_on_a_file(tmp: Path) -> OutBuilt:
    (tmp / "lake").write_text("a file", encoding="utf-8")
    return ["-o", tmp / "out", "--sink", f"delta:{tmp / 'lake'}"], ["is a file; give a folder"]


def _duckdb_other_schema(tmp: Path) -> OutBuilt:
    import duckdb

    con = duckdb.connect(str(tmp / "w.duckdb"))
    con.execute("CREATE TABLE scores (id VARCHAR, other INTEGER)")
    con.close()
    sink = f"duckdb:{tmp / 'w.duckdb'}:scores"
    return ["-o", tmp / "out", "--sink", sink], ["the existing table's columns differ"]


def _locked_folder(tmp: Path) -> OutBuilt:
    lock = tmp / "out" / "_ctxprec" / "lock"
    lock.parent.mkdir(parents=True)
    holder = {"host": "other-host", "pid": 4242, "started_at": "2026-11-30T02:15:00+00:00"}
    lock.write_text(json.dumps({**holder, "command": "ctxprec score", "token": "x"}))
    return ["-o", tmp / "out"], ["is being written by pid 4242 on other-host", "--wait-lock"]


def _negative_wait(tmp: Path) -> OutBuilt:
    return ["-o", tmp / "out", "--wait-lock", "-1"], ["--wait-lock -1: give a number of seconds"]


OUTPUT_CASES: dict[str, Callable[[Path], OutBuilt]] = {
    "object_store_output": _object_store,
    "spark_output_folder": _spark_folder,
    "hidden_files_only_with_overwrite": _hidden_only,
    "unknown_sink_kind": _unknown_sink,
    "duckdb_table_not_an_identifier": _duckdb_bad_table,
    "delta_path_is_a_file": _delta_on_a_file,
    "duckdb_table_with_other_columns": _duckdb_other_schema,
    "folder_locked_by_a_live_run": _locked_folder,
    "negative_wait_lock": _negative_wait,
}


@pytest.mark.parametrize("name", list(OUTPUT_CASES))
def test_output_and_sink_mistakes_stop_before_any_judge_call(
    name: str,
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # a URL taken for a path would show up here as a folder
    source = write(tmp_path / "in.parquet")
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    args, fragments = OUTPUT_CASES[name](tmp_path)
    planted = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p not in before}
    refused(capsys, fake, [source, *args], fragments)
    assert {p: p.read_bytes() for p in planted} == planted
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("module", ["duckdb", "deltalake"])
def test_sink_without_its_extra_in_a_fresh_interpreter(
    module: str, tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """The extra really missing from the interpreter (blocked before anything imports it)."""
    import subprocess

    source = write(tmp_path / "in.parquet")
    sink = f"duckdb:{tmp_path}/w.duckdb:scores" if module == "duckdb" else f"delta:{tmp_path}/l"
    code = (
        f"import sys; sys.modules[{module!r}] = None; from ctxprec.cli.main import main; "
        f"sys.exit(main(sys.argv[1:]))"
    )
    argv = ["score", str(source), "-o", str(tmp_path / "out"), *HTTP, "--sink", sink]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert f"needs the `{module}` package, which is not installed" in done.stderr
    assert fake.stats.total == 0
    assert not (tmp_path / "out").exists()


def test_summary_and_estimate_mistakes_about_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, foreign = write(tmp_path / "in.parquet"), tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "part-00000-abc.snappy.parquet").write_bytes(b"PAR1")
    assert main(["estimate", str(source), "-o", str(foreign)]) == 2
    assert main(["estimate", str(source), "-o", "s3://bucket/x"]) == 2
    assert main(["summary", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err.count("ctxprec: error: ") == 3
    no_traceback(err)
    assert sorted(p.name for p in foreign.iterdir()) == ["part-00000-abc.snappy.parquet"]


def test_dask_engine_without_its_extra(
    tmp_path: Path,
    fake: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    source = write(tmp_path / "in.parquet")
    fragments = ["--engine dask needs dask.distributed, which is not installed"]
    refused(capsys, fake, [source, "-o", tmp_path / "out", "--engine", "dask"], fragments)
    assert not (tmp_path / "out").exists()


def test_input_line_nested_deeper_than_any_log_is_an_input_error(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """A JSON Lines value nested 100,000 levels deep used to kill the process with SIGSEGV in
    PyArrow's JSON reader. It runs in a child process, so a crash fails this test, not pytest;
    a bracket inside a string is text and does not count."""
    import subprocess

    rows = [
        {"id": f"r{i}", "query": f"q{i} [a] {{b}}" * 40, "contexts": ["p [1]", "p {2}"]}
        for i in range(6)
    ]
    deep = '{"id": "deep", "query": "q", "contexts": ["p"], "x": ' + "[" * 100_000
    lines = [json.dumps(r) for r in rows]
    lines.insert(4, deep + "]" * 100_000 + "}")
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    argv = ["score", str(source), "-o", str(tmp_path / "out"), *HTTP]
    code = "import sys; from ctxprec.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    no_traceback(done.stderr)
    assert f"{source} row 5 nests arrays or objects more than 64 levels deep" in done.stderr
    assert fake.stats.total == 0
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")  # brackets in text are fine
    assert subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO).returncode == 0
