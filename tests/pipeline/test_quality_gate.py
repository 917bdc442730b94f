"""The gate's pieces: the threshold is "below X" (equal passes), exit 5 only when no row failed,
`[gate] fail_under` in a config file; and the gate over whole commands: it judges the input's
rows as the output holds them, so the same command gives the same verdict however often it runs
(a retried night, a partial rerun, gates in any order), and a gate with nothing to judge exits 7
(0 with --pass-empty), `score --fail-under` and `compare --fail-drop` alike."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.analysis.quality_gate import EMPTY_GATE_EXIT, GATE_EXIT, gate_exit, under_gate
from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.inputs import write_input
from tests.fakes.runs import score


def test_threshold_is_strictly_below() -> None:
    assert under_gate(0.6, 10, 0.6) is None
    assert under_gate(0.6 - 1e-15, 10, 0.6) is None  # float noise at the threshold passes
    assert under_gate(None, 0, 0.6) is None  # nothing scored: judge_gate says "empty"
    message = under_gate(0.55, 1234, 0.6, 1000)
    assert message is not None
    assert "0.5500" in message
    assert "0.0500 below" in message
    assert "the input's 1,234 scored rows (1,000 scored by this run, 234 by earlier runs)" in (
        message
    )


def test_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from ctxprec.analysis.quality_gate import GateVerdict

    def verdict(outcome: str, pass_empty: bool = False) -> GateVerdict:
        return GateVerdict("--fail-under 0.6", 0.6, outcome, 0, None, 0, 0, pass_empty,
                           None if outcome == "passed" else "--fail-under 0.6 said so")  # fmt: skip

    assert gate_exit(0, None) == 0
    assert gate_exit(1, None) == 1
    assert gate_exit(0, verdict("passed")) == 0
    assert gate_exit(0, verdict("failed")) == GATE_EXIT == 5
    assert "exit 5" in capsys.readouterr().err
    assert gate_exit(1, verdict("failed")) == 1
    err = capsys.readouterr().err
    assert "rows failed" in err
    assert "--fail-under" in err
    assert gate_exit(0, verdict("empty")) == EMPTY_GATE_EXIT == 7
    assert "exit 7" in capsys.readouterr().err
    assert gate_exit(0, verdict("empty", pass_empty=True)) == 0
    assert gate_exit(1, verdict("empty")) == 1  # failed rows still win


def test_fail_under_from_config_file_and_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[judge]\nmodel = "offline"\n[gate]\nfail_under = 0.6\npass_empty = true\n')
    assert load_config(cfg, {}).gate.fail_under == 0.6
    assert load_config(cfg, {}).gate.pass_empty is True
    assert load_config(cfg, {"gate.fail_under": 0.7}).gate.fail_under == 0.7
    assert load_config(None, {}).gate.fail_under is None
    assert load_config(None, {}).gate.pass_empty is False
    cfg.write_text('[gate]\nfail_under = "high"\n')
    with pytest.raises(ConfigError, match=r"\[gate\] fail_under"):
        load_config(cfg, {})


# -- whole commands ---------------------------------------------------------------------------
def _quiet(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """The `--quiet` JSON line of the command that just ran."""
    line: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return line


def _mean_of(out: Path, ids: list[str]) -> tuple[float, int]:
    """The mean score of the output's scored rows among `ids`, read straight from the parts."""
    rows = pl.concat([pl.read_parquet(p).select("id", "status", "score") for p in part_files(out)])
    rows = rows.filter(pl.col("id").is_in(ids) & (pl.col("status") != "failed"))
    return float(rows["score"].mean()), rows.height  # type: ignore[arg-type]


def _gate(line: dict[str, object]) -> dict[str, object]:
    gate = line["quality_gate"]
    assert isinstance(gate, dict)
    return gate


def test_a_retried_night_gets_the_same_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A red night stays red on the identical command: the retry finds nothing new to score
    and still judges the input's rows (exit 5 with the same figure, and in the JSON line)."""
    night = write_input(tmp_path / "logs" / "night.parquet", range(12))
    out = tmp_path / "scores"
    cmd = [night, "-o", out, "--incremental", "--quiet", "--fail-under", 1.5]
    verdicts = []
    for _ in range(3):
        assert score(*cmd) == GATE_EXIT
        line = _quiet(capsys)
        verdicts.append(_gate(line))
        assert line["exit_code"] == GATE_EXIT
    mean, rows = _mean_of(out, [f"r{i}" for i in range(12)])
    first, again, third = verdicts
    assert first["outcome"] == again["outcome"] == third["outcome"] == "failed"
    assert first["mean"] == again["mean"] == pytest.approx(mean, abs=5e-5)
    assert first["rows"] == again["rows"] == rows == 12
    assert (first["rows_this_run"], again["rows_this_run"]) == (12, 0)  # the retry scored none
    assert "all scored by earlier runs" in str(again["message"])
    # the same command with a threshold it meets passes, as often as it runs
    for _ in range(2):
        assert score(night, "-o", out, "--incremental", "--quiet", "--fail-under", 0.0) == 0
        assert _gate(_quiet(capsys))["outcome"] == "passed"


def test_gates_in_every_order_judge_only_the_inputs_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two overlapping nights into one output, their gates run in any order and repeated:
    each judges its own input's ids (those scored tonight and those an earlier night scored)."""
    a = write_input(tmp_path / "logs" / "a.parquet", range(0, 10))
    b = write_input(tmp_path / "logs" / "b.parquet", range(5, 20))
    out = tmp_path / "scores"
    want_a = [f"r{i}" for i in range(0, 10)]
    want_b = [f"r{i}" for i in range(5, 20)]
    seen: dict[str, set[float]] = {"a": set(), "b": set()}
    for name, night in (("b", b), ("a", a), ("b", b), ("a", a), ("b", b)):
        assert score(night, "-o", out, "--incremental", "--quiet", "--fail-under", 1.5) == 5
        gate = _gate(_quiet(capsys))
        mean, rows = _mean_of(out, want_a if name == "a" else want_b)
        assert gate["rows"] == rows == (10 if name == "a" else 15)
        assert gate["mean"] == pytest.approx(mean, abs=5e-5)
        seen[name].add(float(gate["mean"]))  # type: ignore[arg-type]
    assert len(seen["a"]) == len(seen["b"]) == 1  # one verdict per input, whatever the order
    # a run without a gate first, then the gated retry: the same verdict as a gated first run
    c = write_input(tmp_path / "logs" / "c.parquet", range(30, 36))
    assert score(c, "-o", out, "--incremental", "--quiet") == 0
    capsys.readouterr()
    assert score(c, "-o", out, "--incremental", "--quiet", "--fail-under", 1.5) == 5
    assert _gate(_quiet(capsys))["rows"] == 6


def test_a_partial_rerun_is_judged_on_the_whole_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain run's retry (its rows with a bad input row fixed in between) judges every row of
    the input, not only those the retry scored; a gate over failed rows keeps exit 1."""
    src = tmp_path / "log.parquet"
    write_input(src, range(8))
    table = pq.read_table(src)
    queries = table["query"].to_pylist()
    queries[3] = None  # a row that fails on its input
    pq.write_table(table.set_column(1, "query", pa.array(queries, pa.string())), src)
    out = tmp_path / "out"
    assert score(src, "-o", out, "--quiet", "--fail-under", 0.0) == 1  # failed rows win
    err = capsys.readouterr()
    gate = _gate(json.loads(err.out))
    assert (gate["rows"], gate["failed_rows"], gate["outcome"]) == (7, 1, "passed")
    write_input(src, range(8))  # the row fixed: the same command scores it, the others stay
    assert score(src, "-o", out, "--incremental", "--quiet", "--fail-under", 1.5) == 5
    gate = _gate(_quiet(capsys))
    assert (gate["rows"], gate["rows_this_run"], gate["failed_rows"]) == (8, 1, 0)


def test_a_gate_with_nothing_to_judge_exits_7_unless_empty_nights_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(write_input(tmp_path / "x.parquet", range(2))).slice(0, 0), empty)
    out = tmp_path / "out"
    assert score(empty, "-o", out, "--fail-under", 0.5, "--quiet") == EMPTY_GATE_EXIT
    got = capsys.readouterr()
    gate = _gate(json.loads(got.out))
    assert (gate["outcome"], gate["rows"], gate["passed"]) == ("empty", 0, False)
    assert "the input has no rows" in got.err
    assert "--pass-empty" in got.err
    assert score(empty, "-o", out, "--fail-under", 0.5, "--quiet") == EMPTY_GATE_EXIT  # again
    capsys.readouterr()
    assert score(empty, "-o", out, "--fail-under", 0.5, "--quiet", "--pass-empty") == 0
    gate = _gate(_quiet(capsys))
    assert (gate["outcome"], gate["passed"]) == ("empty", True)
    config = tmp_path / "gate.toml"
    config.write_text("[gate]\nfail_under = 0.5\npass_empty = true\n")
    assert score(empty, "-o", out, "--config", config) == 0
    # every row failed: failed rows win (exit 1), and the gate says it had nothing to judge
    bad = tmp_path / "bad.parquet"
    table = pq.read_table(write_input(tmp_path / "y.parquet", range(3)))
    pq.write_table(table.set_column(1, "query", pa.nulls(3, pa.string())), bad)
    capsys.readouterr()
    assert score(bad, "-o", tmp_path / "bad", "--fail-under", 0.5) == 1
    assert "none of the output's 3 rows is scored (3 failed)" in capsys.readouterr().err


def test_fail_drop_with_nothing_to_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare --fail-drop on a night that matches no row: exit 7 (0 with --pass-empty, with a
    note); without a gate it stays a refusal (exit 2)."""
    src = write_input(tmp_path / "logs" / "dt=2026-12-01" / "a.parquet", range(6), "2026-12-01")
    pq.write_table(pq.read_table(src).drop(["dt"]), src)
    out = tmp_path / "scores"
    assert score(tmp_path / "logs", "-o", out, "--partition-by", "dt") == 0
    capsys.readouterr()
    sides = ["compare", str(out), "--a", "dt=2026-11-30", "--b", "dt=2026-12-01"]
    assert main([*sides, "--fail-drop", "0.02"]) == EMPTY_GATE_EXIT
    err = capsys.readouterr().err
    assert "--fail-drop 0.02 had nothing to judge" in err
    assert "no row of" in err
    assert main([*sides, "--fail-drop", "0.02", "--pass-empty", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["gate"]["outcome"] == "empty"
    assert "it passes (--pass-empty)" in got.err
    assert main(sides) == 2  # no gate: nothing to compare is an error, as before
    same = ["compare", str(out), "--a", "dt=2026-12-01", "--b", "dt=2026-12-01"]
    assert main([*same, "--fail-drop", "0.02", "--resamples", "50"]) == 0  # a real comparison
