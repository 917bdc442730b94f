"""`ctxprec compare` on small hand-made outputs: which ids are left out and why, no pairs, URLs,
slices of one output (`--a/--b`, `--on`), judge differences and `--strict`, groups, and the
drop gate at its threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.report.compare import _judge_warning
from tests.fakes.folders import commit


def write_output(
    path: Path,
    ids: list[str],
    scores: list[float | None],
    *,
    statuses: list[str] | None = None,
    prompt: str = "cp-item-v2",
    extra: dict[str, list[Any]] | None = None,
    judge: dict[str, Any] | None = None,
) -> Path:
    """A scored output in the documented columns (the ones compare reads) plus a manifest."""
    n = len(ids)
    statuses = statuses or ["ok" if s is not None else "failed" for s in scores]
    frame = pl.DataFrame(
        {
            "id": ids,
            **(extra or {}),
            "score": scores,
            "status": statuses,
            "reason": [f"why {i}" for i in ids],
            "verdicts": [[True, False]] * n,
            "reciprocal_rank": [None if s is None else 1.0 for s in scores],
            "precision_at_1": [None if s is None else 0.5 for s in scores],
            "judge_model": ["openai/j"] * n,
            "prompt_version": [prompt] * n,
        },
        schema_overrides={"score": pl.Float64},
    )
    path.mkdir(parents=True)
    frame.write_parquet(path / "part-00000-00000.parquet")
    state = path / "_ctxprec"
    state.mkdir()
    describe = {"judge": judge or {"provider": "openai", "model": "j"}, "judge_model": "openai/j",
                "mode": "item", "scale": 1.0, "partition_by": []}  # fmt: skip
    (state / "manifest.json").write_text(json.dumps({"describe": describe}))
    commit(path, path / "part-00000-00000.parquet")
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["compare", *args, "--json", "--resamples", "500"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if code in (0, 5) else {})


def test_left_out_counts_each_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_output(tmp_path / "a", ["1", "2", "3", "4", "5", "6"], [0.5, 0.5, None, 0.2, None, 1])
    b = write_output(tmp_path / "b", ["1", "2", "3", "4", "5", "7"], [0.6, 0.5, 0.1, None, None, 1])
    code, r = run_json(capsys, str(a), str(b))
    assert code == 0
    assert r["n_pairs"] == 2
    assert r["mean_a"] == 0.5
    assert r["mean_b"] == pytest.approx(0.55)
    assert r["left_out"] == {"only_in_a": 1, "only_in_b": 1, "failed_in_a": 1,
                             "failed_in_b": 1, "failed_in_both": 1, "total": 5}  # fmt: skip
    assert r["wins"] == 1
    assert r["ties"] == 1
    assert r["changed_most"][0]["key"] == "1"


def test_no_pairs_and_urls_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_output(tmp_path / "a", ["1", "2"], [0.5, 0.5])
    b = write_output(tmp_path / "b", ["3", "4"], [0.5, 0.5])
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err
    assert "only in a 2" in err
    assert main(["compare", "https://host/scores", str(b)]) == 2
    assert "compare reads local folders and s3://" in capsys.readouterr().err
    assert main(["compare", str(a)]) == 2  # one output needs --a and --b
    assert "--a dt=" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "-o", str(a)]) == 2  # never into an output folder
    assert not (a / "compare.json").exists()


def test_report_folder_replaces_only_an_earlier_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_output(tmp_path / "a", ["1", "2"], [0.5, 0.5])
    b = write_output(tmp_path / "b", ["1", "2"], [0.5, 1.0])
    report = tmp_path / "report"
    assert main(["compare", str(a), str(b), "-o", str(report), "--resamples", "200"]) == 0
    assert main(["compare", str(a), str(b), "-o", str(report), "--resamples", "200"]) == 0
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "compare.md").write_text("my own notes\n")
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "-o", str(theirs)]) == 2
    assert "that ctxprec compare did not write" in capsys.readouterr().err
    assert (theirs / "compare.md").read_text() == "my own notes\n"
    assert not (theirs / "compare.json").exists()


def test_slices_of_one_output_paired_on_a_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_output(
        tmp_path / "o",
        ["bm25/q1", "bm25/q2", "bm25/q3", "dense/q1", "dense/q2", "dense/q3"],
        [0.2, 0.4, 0.6, 0.3, 0.4, 0.9],
        extra={
            "retriever": ["bm25"] * 3 + ["dense"] * 3,
            "query_id": ["q1", "q2", "q3"] * 2,
            "topic": ["x", "x", "y"] * 2,
        },
    )
    args = [str(out), "--a", "retriever=bm25", "--b", "retriever=dense"]
    assert main(["compare", *args]) == 2  # ids differ across slices: no pairs on `id`
    capsys.readouterr()
    code, r = run_json(capsys, *args, "--on", "query_id", "--group-by", "topic")
    assert code == 0
    assert r["n_pairs"] == 3
    assert r["mean_delta"] == pytest.approx(0.4 / 3)
    groups = {g["group"]: g for g in r["by_group"]["groups"]}
    assert groups["x"]["n_pairs"] == 2
    assert groups["x"]["mean_delta"] == pytest.approx(0.05)
    assert groups["y"]["mean_delta"] == pytest.approx(0.3)
    assert main(["compare", str(out), "--a", "retriever=bm25", "--b", "retriever=sparse"]) == 2
    assert "matches" in capsys.readouterr().err


def test_judge_difference_is_loud_and_strict_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_output(tmp_path / "a", ["1", "2"], [0.5, 0.7])
    b = write_output(tmp_path / "b", ["1", "2"], [0.5, 0.7], prompt="cp-item-v3",
                     judge={"provider": "openai", "model": "k"})  # fmt: skip
    code, r = run_json(capsys, str(a), str(b))
    assert code == 0
    assert not r["judge_config"]["same"]
    assert any("prompt_version" in d for d in r["judge_config"]["differences"])
    assert any("judge model" in d for d in r["judge_config"]["differences"])
    assert main(["compare", str(a), str(b)]) == 0
    warnings = [x for x in capsys.readouterr().out.splitlines() if "WARNING" in x]
    assert len(r["judge_config"]["differences"]) > 1
    settings = r["judge_config"]["settings"]
    assert "prompt_version" in settings
    assert "judge model" in settings
    # one line naming both judges and the few settings that differ (it printed one line each);
    # without -o no compare.json exists, so it points to --json
    head = (
        "  WARNING judge configuration differs (A "
        f"{r['judge_config']['judges']['a']}, B {r['judge_config']['judges']['b']}): "
    )
    assert warnings == [
        f"{head}{', '.join(settings)} (--json lists each under judge_config.differences)"
    ]
    written = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(written)]) == 0
    warnings = [x for x in capsys.readouterr().out.splitlines() if "WARNING" in x]
    assert warnings == [
        f"{head}{', '.join(settings)} ({written / 'compare.json'} lists each under "
        "judge_config.differences)"
    ]
    assert (written / "compare.json").is_file()
    assert main(["compare", str(a), str(b), "--strict"]) == 2
    assert "--strict" in capsys.readouterr().err


def test_identical_sides_and_drop_gate_at_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [str(i) for i in range(20)]
    a = write_output(tmp_path / "a", ids, [0.5] * 20)
    same = write_output(tmp_path / "same", ids, [0.5] * 20)
    code, r = run_json(capsys, str(a), str(same))
    assert code == 0
    assert r["ci95"] == [0.0, 0.0]
    assert r["mean_delta"] == 0.0
    b = write_output(tmp_path / "b", ids, [0.47] * 20)  # worse by 0.03 on every id
    assert run_json(capsys, str(a), str(b), "--fail-drop", "0.02")[0] == 5
    assert run_json(capsys, str(a), str(b), "--fail-drop", "0.03")[0] == 0  # not *more* than
    assert run_json(capsys, str(a), str(b), "--fail-drop", "0.04")[0] == 0
    code, r = run_json(capsys, str(a), str(b), "--fail-drop", "0.02")
    assert code == 5
    assert r["gate"]["failed"]
    assert "0.0100 more than allowed" in r["gate"]["message"]


def test_many_differing_settings_are_counted_not_listed() -> None:
    """Past a few, the warning line counts the settings and points to where each is listed."""
    six = [f"judge s{i}" for i in range(6)]
    judge = {"differences": [f"{s}: A 1, B 2" for s in six], "settings": six,
             "judges": {"a": "openai/x", "b": "openai/y"}}  # fmt: skip
    assert _judge_warning(judge, None) == [
        "  WARNING judge configuration differs (A openai/x, B openai/y): 6 settings differ "
        "(--json lists each under judge_config.differences)"
    ]
    one = {**judge, "differences": ["mode: A 'item', B 'row'"], "settings": ["mode"]}
    assert _judge_warning(one, None) == [
        "  WARNING judge configuration differs (A openai/x, B openai/y): mode: A 'item', B 'row'"
    ]
