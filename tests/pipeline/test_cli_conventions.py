"""Conventions a CLI user expects: --version, defaults and help for every flag, no prefix
matching, "did you mean", flags named in errors, extractors from files, `cache info|clear`."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import build_parser, main
from ctxprec.storage.core import errors
from ctxprec.storage.memo.store import Memo
from tests.fakes.inputs import documentation


def log(path: Path, n: int = 4) -> Path:
    pl.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "query": [f"Who wrote book {i}?" for i in range(n)],
            "expected_output": [f"Author {i}" for i in range(n)],
            "blob": [f"Book {i} was written by Author {i}.||Other." for i in range(n)],
            "contexts": [[f"Book {i} was written by Author {i}.", "Other."] for i in range(n)],
            "retriever": ["a", "b"] * (n // 2),
        }
    ).write_parquet(path)
    return path


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"ctxprec \d+\.\d+\S*\n", capsys.readouterr().out)


def test_every_flag_has_help_and_every_parser_refuses_abbreviations() -> None:
    parser = build_parser()
    assert parser.allow_abbrev is False
    for name, sub in subparsers(parser).items():
        assert sub.allow_abbrev is False, name
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_help_states_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for fragment in (
        "(default: 32)",  # --concurrency
        "(default: offline)",
        "(default: no limit)",
        "(default: 1,3,5)",
        "(default: 1000)",
        "(default: 6)",  # --max-retries
        "(default: 60)",  # --timeout
        "(default: item)",
        "(default: verdicts)",
    ):
        assert fragment in text, fragment


def test_a_prefix_is_not_a_flag_and_a_typo_gets_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = log(tmp_path / "in.parquet")
    with pytest.raises(SystemExit) as done:
        main(["score", str(src), "-o", str(tmp_path / "o"), "--partition", "dt"])
    assert done.value.code == 2
    assert "did you mean --partition-by?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["score", str(src), "-o", str(tmp_path / "o"), "--concurency", "4"])
    assert "did you mean --concurrency?" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_errors_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = log(tmp_path / "in.parquet")
    assert main(["score", str(src), "-o", str(tmp_path / "o"), "--concurrency", "0"]) == 2
    err = capsys.readouterr().err
    assert "--concurrency must be at least 1" in err
    assert "limits.concurrency" not in err


def test_estimate_refuses_flags_it_does_not_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = log(tmp_path / "in.parquet")
    assert main(["estimate", str(src), "--group-by", "retriever", "--scale", "10"]) == 2
    err = capsys.readouterr().err
    assert "--scale, --group-by" in err


def test_extractor_from_a_file_and_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = log(tmp_path / "in.parquet")
    code = "def split(row):\n    return row['blob'].split('||')\n"
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "myx.py").write_text(code)
    (tmp_path / "here_mod.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    for i, spec in enumerate(["tools/myx.py:split", "here_mod:split"]):
        out = tmp_path / f"o{i}"
        assert main(["score", str(src), "-o", str(out), "--extractor", spec]) == 0, spec
        rows = pl.read_parquet(out / "*.parquet")
        assert rows["context_count"].to_list() == [2] * 4


def test_group_by_says_it_takes_one_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = log(tmp_path / "in.parquet")
    args = ["score", str(src), "-o", str(tmp_path / "o"), "--group-by", "retriever,id"]
    assert main(args) == 2
    assert "--group-by must be one column" in capsys.readouterr().err


def test_group_by_an_input_column_keeps_it_and_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Grouping by an input column needs no --passthrough: the output keeps the column (the
    summary's groups are read from it) and one note says so."""
    src = log(tmp_path / "in.parquet")
    out = tmp_path / "o"
    args = ["score", str(src), "-o", str(out), "--group-by", "retriever", "--progress", "off"]
    assert main(args) == 0
    err = capsys.readouterr().err
    note = "--group-by retriever keeps the input column `retriever` in the output"
    assert err.count(note) == 1, err
    assert "error" not in err
    rows = pl.read_parquet(out / "*.parquet")
    assert sorted(set(rows["retriever"])) == ["a", "b"]
    groups = json.loads((out / "summary.json").read_text())["by_group"]
    assert groups["column"] == "retriever"
    assert "## By retriever" in (out / "summary.md").read_text()
    # the same command again resumes (same configuration), and says it again
    assert main(args) == 0
    assert capsys.readouterr().err.count(note) == 1


def test_numbers_are_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = log(tmp_path / "in.parquet")
    out = tmp_path / "o"
    args = ["--passthrough", "retriever", "--group-by", "retriever", "--progress", "off"]
    assert main(["score", str(src), "-o", str(out), *args]) == 0
    printed = capsys.readouterr().out
    md = (out / "summary.md").read_text()
    for text in (printed, md):
        assert "None" not in text
        assert not re.search(r"\d\.\d{3,} s\b", text), text
        assert not re.search(r"\d\.\d{3,} rows/s", text), text
    assert "| #1 |" in md  # positions for people start at 1
    assert "| wall time | " in md
    assert main(["estimate", str(src)]) == 0
    assert "None" not in capsys.readouterr().out


def test_group_chart_labels_carry_n() -> None:
    from ctxprec.storage.report.charts import _scores_by_group

    class Ax:
        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: self.seen.append((name, a, k))

        def __init__(self) -> None:
            self.seen: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    ax = Ax()
    group = {"group": "bm25", "rows": 1234, "median": 0.5, "p25": 0.4, "p75": 0.6}
    summary = {
        "by_group": {
            "column": "retriever",
            "groups": [{**group, "p10": 0, "p90": 1, "mean_score": 0.5}],
        },
        "scale": 1.0,
        "bands": [],
    }
    with contextlib.suppress(Exception):  # the fake axes draw nothing; the labels matter
        _scores_by_group(ax, summary)  # type: ignore[arg-type]
    boxes = [a[0] for name, a, _ in ax.seen if name == "bxp"]
    assert boxes
    assert boxes[0][0]["label"] == "bm25 (n=1,234)"


def test_cache_info_and_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "memo"
    memo = Memo(folder)
    memo.set_many([("old", (True, "r", 1, 1)), ("new", (False, "r", 1, 1))])
    memo.close()
    import sqlite3

    with sqlite3.connect(folder / "cache.db") as con:  # age one entry by 40 days
        con.execute(
            "UPDATE Cache SET store_time = ? WHERE key = 'old'", (time.time() - 40 * 86400,)
        )
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(folder))
    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert str(folder) in info
    assert "2 verdicts" in info
    assert main(["cache", "clear", "--older-than", "30d", "--yes"]) == 0
    assert "removed 1 verdicts" in capsys.readouterr().out
    assert main(["cache", "clear", "--older-than", "soon"]) == 2
    assert "--older-than 'soon': give a duration such as" in capsys.readouterr().err
    not_a_folder = folder / "cache.db"  # the memo folder comes through the settings' loader
    assert main(["cache", "info", "--cache-dir", str(not_a_folder)]) == 2
    assert "--cache-dir is" in capsys.readouterr().err
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(not_a_folder))
    assert main(["cache", "info"]) == 2
    assert "CTXPREC_CACHE_DIR (environment) is" in capsys.readouterr().err
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(folder))
    assert main(["cache", "clear", "--yes"]) == 0
    assert "removed 1 verdicts" in capsys.readouterr().out
    memo = Memo(folder)
    assert len(memo) == 0
    memo.close()


def test_passthrough_named_like_an_output_column_can_be_renamed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.parquet"
    log(tmp_path / "base.parquet")
    pl.read_parquet(tmp_path / "base.parquet").with_columns(
        pl.lit(0.5).alias("score"), pl.lit("x").alias("status")
    ).write_parquet(src)
    assert main(["score", str(src), "-o", str(tmp_path / "a"), "--passthrough", "score"]) == 2
    assert "--passthrough score=NEW_NAME" in capsys.readouterr().err
    out = tmp_path / "b"
    flags = ["--passthrough", "score=upstream_score,status=upstream_status,retriever"]
    assert main(["score", str(src), "-o", str(out), *flags, "--group-by", "retriever"]) == 0
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["upstream_score"].to_list() == [0.5] * 4
    assert rows["upstream_status"].to_list() == ["x"] * 4
    assert set(rows["status"]) == {"ok"}
    assert rows["retriever"].to_list() == ["a", "b", "a", "b"]


def _synopsis() -> dict[str, set[str]]:
    text = documentation()
    block = re.search(r"```\n(ctxprec score INPUT.*?)```", text, re.S)
    assert block, "README: the command synopsis is missing"
    flags: dict[str, set[str]] = {}
    command = ""
    for line in block.group(1).splitlines():
        if line.startswith("ctxprec "):
            command = line.split()[1]
        found = re.findall(r"(?<![\w-])--[a-z][a-z-]*|(?<![\w-])-o(?= )", line)
        flags.setdefault(command, set()).update("--output" if f == "-o" else f for f in found)
    return flags


def test_readme_synopsis_and_help_list_the_same_flags() -> None:
    documented = _synopsis()
    for name, sub in subparsers(build_parser()).items():
        shown = {
            s
            for a in sub._actions
            if a.help is not argparse.SUPPRESS
            for s in a.option_strings
            if s.startswith("--") and s != "--help"
        }
        assert documented.get(name, set()) - {"--version"} == shown, name


def test_readme_defaults_match_the_help() -> None:
    text = " ".join(documentation().split())
    para = re.search(r"Defaults \(also in every `--help`\): (.*?)\. Flags are matched", text)
    assert para
    score_parser = subparsers(build_parser())["score"]
    helps = {s: str(a.help) for a in score_parser._actions for s in a.option_strings}
    pairs = re.findall(r"`(--[a-z-]+) ([^`]+)`", para.group(1))
    assert len(pairs) >= 8
    for flag, value in pairs:
        got = re.search(r"\(default: ([^)]*)\)", helps[flag])
        assert got, (flag, helps[flag], value)
        assert got.group(1) == value, (flag, helps[flag], value)


def test_each_error_class_carries_its_exit_code() -> None:
    """The CLI returns `exc.exit_code`: the exit-code table lives on the exception classes."""
    codes = {
        errors.CtxprecError: 3,
        errors.UserError: 2,
        errors.ConfigError: 2,
        errors.InputError: 2,
        errors.OutputError: 2,
        errors.JudgeRefusedRunError: 4,
        errors.BatchesPendingError: 6,
        errors.JudgeError: 1,
        errors.ScoreFailedError: 1,
    }
    assert {cls: cls.exit_code for cls in codes} == codes
