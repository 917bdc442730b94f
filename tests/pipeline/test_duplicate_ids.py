"""Duplicate ids: refused by default, with rows and lines numbered from 1 as editors number
them; `--duplicate-ids keep-first|keep-last` (or `[columns] duplicate_ids`) scores one row of
each id, across files and batches, and the summary counts what it dropped."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.runs import score

# ids r0..r4; r0, r1 and r3 come back later with other queries: 3 ids, 3 extra rows
IDS = ["r0", "r1", "r2", "r3", "r4", "r0", "r1", "r3"]


def rows() -> list[dict[str, object]]:
    return [
        {"id": rid, "query": f"question {i}?", "contexts": [f"passage {i}", "other"]}
        for i, rid in enumerate(IDS)
    ]


def write_jsonl(path: Path, blank_after: int | None = None) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i, row in enumerate(rows()):
            out.write(json.dumps(row) + "\n")
            if i == blank_after:
                out.write("\n")  # a blank line: editors count it, readers skip it
    return path


def write_csv(path: Path) -> Path:
    frame = pl.DataFrame([{**r, "contexts": json.dumps(r["contexts"])} for r in rows()])
    frame.write_csv(path)
    return path


def test_refused_by_default_with_rows_and_lines_counted_from_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parquet = tmp_path / "in.parquet"
    pl.DataFrame(rows()).write_parquet(parquet)
    jsonl = write_jsonl(tmp_path / "in.jsonl", blank_after=2)
    csv = write_csv(tmp_path / "in.csv")
    wanted = {
        parquet: f"{parquet} row 1; {parquet} row 6",  # the first row is row 1
        jsonl: f"{jsonl} line 1; {jsonl} line 7",  # the blank line 4 counted, as an editor does
        csv: f"{csv} row 1; {csv} row 6",  # data rows, after the header
    }
    for path, where in wanted.items():
        assert score(path, "-o", tmp_path / f"out-{path.suffix[1:]}") == 2
        err = capsys.readouterr().err
        assert f"duplicate id 'r0' in column `id`: {where} (3 duplicated ids in total)" in err
        assert "--duplicate-ids keep-first|keep-last" in err
        assert "Traceback" not in err


@pytest.mark.parametrize(("policy", "kept"), [("keep-first", range(5)), ("keep-last", None)])
def test_a_keep_policy_scores_one_row_of_each_id_and_counts_the_rest(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    policy: str,
    kept: range | None,
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    pl.DataFrame(rows()[:6]).write_parquet(src / "a.parquet")  # r0 twice in the first file
    pl.DataFrame(rows()[6:]).write_parquet(src / "b.parquet")  # r1 and r3 again in the second
    out = tmp_path / "out"
    args = ("--duplicate-ids", policy, "--batch-rows", 2, "--passthrough", "query")
    assert score(src, "-o", out, *args) == 0
    printed = capsys.readouterr().out
    scored = pl.concat([pl.read_parquet(p) for p in part_files(out)]).sort("id")
    assert scored["id"].to_list() == ["r0", "r1", "r2", "r3", "r4"]
    firsts = {rid: i for i, rid in reversed(list(enumerate(IDS)))}
    lasts = {rid: i for i, rid in enumerate(IDS)}
    which = firsts if kept is not None else lasts
    assert scored["query"].to_list() == [f"question {which[r]}?" for r in scored["id"]]
    said = f"3 ids of the input repeated on several rows: the {policy.split('-')[1]} row"
    assert said in printed
    assert "3 other rows dropped" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["duplicate_ids"] == {"policy": policy, "ids": 3, "rows_dropped": 3}
    assert summary["rows"]["total"] == 5
    assert said in (out / "summary.md").read_text()
    assert said in (out / "summary.html").read_text()
    # the same command again resumes the same run: nothing is scored twice
    assert score(src, "-o", out, *args) == 0
    assert pl.concat([pl.read_parquet(p) for p in part_files(out)]).height == 5


def test_the_policy_from_config_and_in_the_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl")
    config = tmp_path / "c.toml"
    config.write_text('[columns]\nduplicate_ids = "keep-last"\n')
    assert main(["estimate", str(src), "--config", str(config), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["rows"] == 5
    assert est["rows_dropped_as_duplicates"] == 3
    assert main(["estimate", str(src), "--config", str(config)]) == 0
    assert "3 rows repeating an id are dropped" in capsys.readouterr().out
    assert score(src, "-o", tmp_path / "out", "--config", config, "--quiet") == 0
    line = json.loads(capsys.readouterr().out)
    assert line["rows"]["total"] == 5
    assert any("repeated on several rows" in n for n in line["notices"])
    config.write_text('[columns]\nduplicate_ids = "keep-some"\n')
    assert main(["estimate", str(src), "--config", str(config)]) == 2
    assert "keep-first" in capsys.readouterr().err
