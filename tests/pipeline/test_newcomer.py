"""What a newcomer meets in a first afternoon: a closed pipe, refusals that offer only
what works, `--map` with commas, mapping errors that name every field, figures that read the same
everywhere, help that says what the code does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.config import example_configs
from ctxprec.cli.main import BROKEN_PIPE_EXIT, main
from ctxprec.flow.reason import build_reason, failed_reason
from ctxprec.storage.core.figures import figure_text, percent_text, round_figure
from tests.fakes.inputs import KEY, REPO, SAMPLE, documentation, write_input
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread
from tests.fakes.runs import score


def cli(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`python -m ctxprec.cli.main ARGS` in its own process, from this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "ctxprec.cli.main", *map(str, args)],
        env=env,
        text=True,
        **{"stderr": subprocess.PIPE, **kwargs},
    )


@pytest.fixture
def sample_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    assert score(SAMPLE, "-o", out) == 0
    return out


def test_a_reader_that_leaves_early_ends_the_command_quietly(sample_out: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before ctxprec writes a line
    try:
        done = cli("summary", sample_out, stdout=write)
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == BROKEN_PIPE_EXIT == 0  # normal use: pipefail scripts go on


def test_summary_into_head(sample_out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = (
        f"set -o pipefail; '{sys.executable}' -m ctxprec.cli.main summary '{sample_out}' | head -1"
    )
    done = subprocess.run(
        ["bash", "-c", command], env=env, text=True, capture_output=True, check=True
    )
    assert done.stdout.startswith("ctxprec: 12 rows")
    assert done.stderr == ""


def test_score_help_says_every_input_format_and_lists_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("Parquet, JSON Lines", "CSV", "--mode {item,row}", "--reason {verdicts,llm}"):
        assert fragment in text, fragment


def test_estimate_prints_limits_as_people_write_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", str(SAMPLE), "--tpm", "2000000", "--rpm", "1500.5"]) == 0
    out = capsys.readouterr().out
    assert "tpm 2,000,000" in out
    assert "rpm 1,500.5" in out
    assert "e+" not in out


def test_reasons_have_no_doubled_punctuation() -> None:
    text = build_reason(
        [True, False],
        ["Canberra is named (canberra).", "Off topic;"],
        score=1.0,
        scale=1.0,
        criterion="Is the item useful for the answer?.",
    )
    assert "(canberra); #2" in text
    assert "Off topic." in text
    for doubled in ("..", ".;", ";.", "?."):
        assert doubled not in text, (doubled, text)
    cut = build_reason([False], ["x" * 400], score=0.0, scale=1.0, criterion="Is the item useful")
    assert "x…. No item" not in cut
    assert "x… No item" in cut
    failed = failed_reason(2, [1], "http_500: server error.")
    assert "error. Re-run" in failed
    assert ".." not in failed


def test_map_takes_commas_repeated_flags_and_commas_in_a_name(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pl.DataFrame(
        {
            "id": ["a", "b"],
            "question": ["Who wrote Dune?", "Capital of France?"],
            "ground_truth": ["Frank Herbert", "Paris"],
            "docs,v2": [["Dune is by Frank Herbert.", "Rain."], ["Paris is the capital.", "Sun."]],
        }
    ).write_parquet(src)
    for maps in (
        ["--map", "query=question,expected=ground_truth,context=docs,v2"],
        ["--map", "query=question", "--map", "expected=ground_truth, context=docs,v2"],
    ):
        out = tmp_path / f"out{len(maps)}"
        assert score(src, "-o", out, *maps) == 0
        run = json.loads((out / "summary.json").read_text())
        assert run["rows"]["ok"] == 2
        assert not run["run"].get("notices"), run["run"].get("notices")  # expected was mapped


def test_the_first_mapping_error_names_every_field_the_data_seems_to_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "hotpot_like.parquet"
    pl.DataFrame(
        {
            "id": ["a", "b"],
            "question": ["Who wrote Dune?", "Capital of France?"],
            "ground_truth": ["Frank Herbert", "Paris"],
            "contexts": [["Dune is by Frank Herbert.", "Rain."], ["Paris is the capital.", "Sun."]],
            "labels": [[True, False], [True, False]],
            "source": ["x", "y"],
        }
    ).write_parquet(src)
    assert score(src, "-o", tmp_path / "o1") == 2
    err = capsys.readouterr().err
    offered = "--map query=question,expected=ground_truth,labels=labels"
    assert offered in err
    assert "expected is the expected output" in err
    # following the suggestion: a run with nothing left to warn about
    assert score(src, "-o", tmp_path / "o2", *offered.split()) == 0
    summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert summary["run"].get("notices") in (None, [])
    assert summary["labels"]["items"] == 4


def test_a_folder_holding_another_run_is_offered_only_what_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert score(SAMPLE, "-o", out) == 0
    capsys.readouterr()
    # another configuration: --incremental would be refused, so it is not offered
    assert score(SAMPLE, "-o", out, "--scale", 10) == 2
    err = capsys.readouterr().err
    assert "use a new folder, or --overwrite to replace it" in err
    assert "--incremental to add" not in err
    assert score(SAMPLE, "-o", out, "--scale", 10, "--incremental") == 2
    assert "--overwrite instead of --incremental" in capsys.readouterr().err
    assert score(SAMPLE, "-o", out, "--scale", 10, "--overwrite") == 0
    # the same configuration over other input: adding to it works, so it is offered
    half = tmp_path / "half.parquet"
    pl.read_parquet(SAMPLE).head(6).write_parquet(half)
    assert score(half, "-o", tmp_path / "other", "--scale", 10) == 0
    capsys.readouterr()
    assert score(SAMPLE, "-o", tmp_path / "other", "--scale", 10) == 2
    assert "--incremental to add to it" in capsys.readouterr().err
    assert score(SAMPLE, "-o", tmp_path / "other", "--scale", 10, "--incremental") == 0


def test_the_first_nights_compare_names_the_nights_there_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_input(tmp_path / "logs" / "2026-11-30.parquet", range(4), dt="2026-11-30")
    out = tmp_path / "scores"
    flags = ("--incremental", "--passthrough", "dt", "--partition-by", "dt")
    assert score(src, "-o", out, *flags) == 0
    capsys.readouterr()
    code = main(["compare", str(out), "--a", "dt=2026-11-29", "--b", "dt=2026-11-30"])
    assert code == 2
    err = capsys.readouterr().err
    assert "matches dt=2026-11-29" in err
    assert "(values of `dt` there: 2026-11-30)" in err


def test_summary_shows_the_prompt_versions_rows_used(tmp_path: Path, sample_out: Path) -> None:
    src = tmp_path / "all_expected.parquet"
    pl.read_parquet(SAMPLE).filter(pl.col("expected_output").is_not_null()).write_parquet(src)
    assert score(src, "-o", tmp_path / "o") == 0
    assert "| prompt version | cp-item-v3 |" in (tmp_path / "o" / "summary.md").read_text()
    # the sample has one row without an expected output: both versions, with their rows
    text = (sample_out / "summary.md").read_text()
    assert "| prompt version | cp-item-v3 (11 rows) / cp-item-query-v3 (1 row) |" in text


def half_way_log(path: Path) -> tuple[Path, dict[str, bool]]:
    """40 rows whose scores average exactly 0.40175 under the fake judge (verdicts overridden):
    2 x [no, yes, yes] (0.58), 27 x [no, no, yes] (0.33), 6 x [yes] (1.0), 5 x [no] (0.0)."""
    shapes = [[False, True, True]] * 2 + [[False, False, True]] * 27 + [[True]] * 6 + [[False]] * 5
    overrides: dict[str, bool] = {}
    contexts = []
    for i, shape in enumerate(shapes):
        items = [f"passage {i}.{j}" for j in range(len(shape))]
        overrides |= dict(zip(items, shape, strict=True))
        contexts.append(items)
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(40)],
            "query": [f"question {i}?" for i in range(40)],
            "expected_output": [f"answer {i}" for i in range(40)],
            "contexts": contexts,
        }
    ).write_parquet(path)
    return path, overrides


def test_one_rounding_rule_for_every_figure_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert round_figure(0.40175) == 0.4018
    assert round_figure(sum([0.33] * 27 + [0.58] * 2 + [1.0] * 6) / 40) == 0.4018  # float noise
    assert round_figure(-0.40175) == -0.4018  # a change and its opposite read alike
    assert figure_text(0.40175) == "0.4018"
    assert percent_text(0.416750) == "41.7%"
    src, overrides = half_way_log(tmp_path / "log.parquet")
    out = tmp_path / "out"
    with FakeJudgeThread(FakeJudgeConfig(overrides=overrides)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        code = score(src, "-o", out, "--model", "openai/j", "--quiet", "--fail-under", 0.5)
    assert code == 5
    shown = capsys.readouterr()
    assert json.loads(shown.out)["score_mean"] == 0.4018
    said = "the input's 40 scored rows (all scored by this run) is 0.4018, 0.0982 below"
    assert said in shown.err
    assert json.loads((out / "summary.json").read_text())["score"]["mean"] == 0.4018
    assert "| 0.4018 |" in (out / "summary.md").read_text()
    assert main(["summary", str(out)]) == 0
    assert "score mean 0.4018 " in capsys.readouterr().out
    assert main(["compare", str(out), str(out), "--resamples", "100"]) == 0
    assert "0.4018" in capsys.readouterr().out


def test_each_reader_gets_dt_as_the_readme_says(tmp_path: Path) -> None:
    """README "The type of `dt`": string wherever ctxprec writes it, and the option that gives
    the string in each reader that guesses a date from the folder name."""
    duckdb = pytest.importorskip("duckdb")
    deltalake = pytest.importorskip("deltalake")
    readme = " ".join(documentation().split())
    for option in ("try_parse_hive_dates=False", "hive_types_autocast = false"):
        assert option in readme, option
    src = tmp_path / "logs" / "dt=2026-11-30" / "a.parquet"
    write_input(src, range(3))
    pl.read_parquet(src).drop("dt").write_parquet(src)  # the value lives in the folder name
    out = tmp_path / "scores"
    sinks = ("--sink", f"duckdb:{tmp_path / 'w.duckdb'}:t", "--sink", f"delta:{tmp_path / 'd'}")
    assert score(src.parent, "-o", out, "--partition-by", "dt", "--passthrough", "dt", *sinks) == 0
    glob = str(out / "**" / "*.parquet")
    guessed = pl.read_parquet(glob, hive_partitioning=True).schema["dt"]
    told = pl.read_parquet(glob, hive_partitioning=True, try_parse_hive_dates=False).schema["dt"]
    assert (guessed, told) == (pl.Date, pl.String)
    con = duckdb.connect()
    typed = "SELECT typeof(dt) FROM read_parquet('{}'{}) LIMIT 1"
    assert con.sql(typed.format(glob, "")).fetchall() == [("DATE",)]
    assert con.sql(typed.format(glob, ", hive_types_autocast = false")).fetchall() == [("VARCHAR",)]
    sink = duckdb.connect(str(tmp_path / "w.duckdb"))
    assert sink.sql("SELECT typeof(dt) FROM t LIMIT 1").fetchall() == [("VARCHAR",)]
    delta = deltalake.DeltaTable(str(tmp_path / "d")).to_pyarrow_table()
    assert str(delta.schema.field("dt").type) in ("string", "large_string", "string_view")


def test_the_example_configs_ship_in_the_package_and_equal_configs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped = example_configs()
    in_repo = {p.stem: p.read_text(encoding="utf-8") for p in (REPO / "configs").glob("*.toml")}
    assert shipped == in_repo  # configs/*.toml, read through the pipeline/configs link
    assert main(["config", "openai"]) == 0
    assert capsys.readouterr().out == in_repo["openai"]
    assert main(["config"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in in_repo)
    assert main(["config", "nope"]) == 2
    assert "there are anthropic, offline, openai, vllm" in capsys.readouterr().err


def test_help_points_at_configs_a_wheel_has(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "see configs/" not in text
    assert "ctxprec config NAME > my.toml" in text


def entry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script's entry point (`ctxprec.__main__:main`) in its own process, with
    `tmp_path/shadow` first on PYTHONPATH, as another project's packages would be."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(REPO)])}
    code = "import sys; from ctxprec.__main__ import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_other_projects_packages_of_generic_names_do_not_matter(tmp_path: Path) -> None:
    """ctxprec installs one top-level name, `ctxprec`: packages called pipeline, storage and
    connectors first on the path (one that imports, one that fails to, one empty) change
    nothing for the command, which scores the sample."""
    for package, init in [
        ("pipeline", "NAME = 'a data pipeline library'\n"),
        ("storage", "raise ImportError('storage needs a cloud SDK')\n"),
        ("connectors", ""),
    ]:
        (tmp_path / "shadow" / package).mkdir(parents=True)
        (tmp_path / "shadow" / package / "__init__.py").write_text(init, encoding="utf-8")
    version = entry(tmp_path, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ctxprec ")
    done = entry(tmp_path, "score", str(SAMPLE), "-o", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"]["total"] == 12


def test_the_entry_point_runs_the_cli_when_the_packages_are_ours(tmp_path: Path) -> None:
    (tmp_path / "shadow").mkdir()
    done = entry(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ctxprec ")


def test_a_rerun_keeps_the_outputs_history_and_shows_this_run_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "out"
    sink = ("--sink", f"duckdb:{tmp_path / 'w.duckdb'}:scores")
    assert score(SAMPLE, "-o", out, *sink) == 0
    first = json.loads((out / "summary.json").read_text())
    calls = first["judge"]["calls"]
    assert calls > 0
    capsys.readouterr()
    assert score(SAMPLE, "-o", out, *sink) == 0  # the same finished command again
    printed = capsys.readouterr().out
    assert "this run: nothing new to score" in printed
    assert f"all runs: 2 runs, 12 rows scored, {calls} judge calls" in printed
    md = (out / "summary.md").read_text()
    assert "handled 0 rows" not in md
    assert "0 judge calls/s" not in md
    assert "The last run found nothing new to score" in md
    assert f"2 runs wrote it: 12 rows scored, {calls} judge calls" in md
    history = json.loads((out / "summary.json").read_text())["history"]
    assert [r["rows_this_run"] for r in history["runs"]] == [12, 0]
    assert [r["judge_calls"] for r in history["runs"]] == [calls, 0]
    assert history["total"]["judge_calls"] == calls
    assert "## Runs" in md
    # `ctxprec summary` rebuilds: no "this run", no sink line as if it had just loaded rows
    assert main(["summary", str(out)]) == 0
    rebuilt = capsys.readouterr().out
    assert "this run" not in rebuilt
    assert "sink" not in rebuilt
    assert f"all runs: 2 runs, 12 rows scored, {calls} judge calls" in rebuilt
    assert duckdb.connect(str(tmp_path / "w.duckdb")).sql("SELECT count(*) FROM scores").fetchall()[
        0
    ] == (12,)
    # --overwrite replaces the output: its history starts again
    assert score(SAMPLE, "-o", out, "--overwrite") == 0
    runs = json.loads((out / "summary.json").read_text())["history"]["runs"]
    assert len(runs) == 1


def test_a_config_from_a_pipe_reads_and_a_missing_one_points_at_ctxprec_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    me = f"'{sys.executable}' -m ctxprec.cli.main"
    command = f"{me} estimate '{SAMPLE}' --json --config <({me} config openai)"
    done = subprocess.run(
        ["bash", "-c", command], env=env, cwd=tmp_path, text=True, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["judge_model"] == "openai/gpt-4o-mini"
    assert main(["estimate", str(SAMPLE), "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "`ctxprec config NAME > my.toml`" in err
    assert "configs/" not in err


def test_quiet_json_rounds_wall_time(tmp_path: Path) -> None:
    """`--quiet` printed "wall_s": 0.2654213900000286; it is rounded like every figure."""
    done = cli("score", SAMPLE, "-o", tmp_path / "out", "--quiet", stdout=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    wall = json.loads(done.stdout.splitlines()[-1])["wall_s"]
    assert wall == round_figure(wall, 2)
    assert len(repr(wall)) <= 6


def test_counts_read_in_the_right_number() -> None:
    from ctxprec.storage.core.figures import counted

    assert counted(1, "row") == "1 row"
    assert counted(2, "judge call") == "2 judge calls"
    assert counted(1, "duplicated id") == "1 duplicated id"
    assert counted(3, "retry") == "3 retries"
    assert counted(0, "memo hit") == "0 memo hits"
    assert counted(1234, "row") == "1,234 rows"


def test_failures_say_which_a_rerun_can_fix() -> None:
    """A null query or a 5 MB item fails again on every re-run: the CLI says to fix the input,
    and offers a retry only for the judge's failures."""
    from ctxprec.cli.commands import failure_lines

    both = "\n".join(failure_lines({"invalid_input": 2, "timeout": 1}))
    assert "1 row failed (timeout x1); re-run the same command to retry only them" in both
    assert "2 rows failed on their input" in both
    assert "a re-run cannot fix them" in both
    only_input = "\n".join(failure_lines({"invalid_input": 1}))
    assert "retry" not in only_input


def test_help_says_what_the_code_does(capsys: pytest.CaptureFixture[str]) -> None:
    """Top-level help names every input format; `score --help` has examples and exit codes,
    and -o stands with the input, not before it."""
    with pytest.raises(SystemExit):
        main(["--help"])
    top = " ".join(capsys.readouterr().out.split())
    assert "Parquet, JSON Lines and CSV" in top
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    help_text = capsys.readouterr().out
    assert "examples:\n  ctxprec score " in help_text
    assert "exit codes:" in help_text
    assert "130 Ctrl-C, 143 SIGTERM" in help_text
    group = help_text.index("input and output:")
    after = help_text[group:]
    assert (
        after.index("input ") < after.index("-o OUTPUT, --output OUTPUT") < after.index("--config")
    )


def test_a_typo_in_a_subcommand_shows_that_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["score", "in.parquet", "-o", "out", "--concurency", "3"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ctxprec score ")
    assert "did you mean --concurrency?" in err


def test_charts_are_an_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib is the `charts` extra: without it a run and `ctxprec summary` write the
    summary without pictures, and --charts is refused before any judge call, naming the extra."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "out"
    assert main(["score", str(SAMPLE), "-o", str(out), "--charts"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'ctxprec[charts]'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (out / "_SUCCESS").exists()
    assert main(["score", str(SAMPLE), "-o", str(out)]) == 0
    assert main(["summary", str(out)]) == 0
    assert "no charts drawn" in capsys.readouterr().err
    assert not (out / "charts").exists()
    assert "](charts/" not in (out / "summary.md").read_text(encoding="utf-8")  # no picture


def test_a_terminal_of_size_0x0_still_shows_progress() -> None:
    """On a pty reporting 0x0 columns and rows (`script -c`, some CI runners) the bar
    followed a width of 0 and showed nothing for a whole run."""
    import fcntl
    import pty
    import struct
    import termios

    import anyio

    from ctxprec.connectors.judges.base import JudgeStats
    from ctxprec.flow.dispatch import RunCounters
    from ctxprec.run.progress import Progress

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    assert os.get_terminal_size(slave).columns == 0
    stream = os.fdopen(slave, "w", buffering=1, encoding="utf-8")
    counters = RunCounters(rows_judged=7)
    progress = Progress(20, counters, JudgeStats(), stream=stream)
    assert progress.mode == "bar"

    async def show() -> None:
        with anyio.move_on_after(0.6):
            await progress.run()

    anyio.run(show)
    stream.flush()
    os.set_blocking(master, False)
    shown = os.read(master, 65536).decode("utf-8", "replace")
    stream.close()
    os.close(master)
    assert "7/20" in shown
    assert "row" in shown


def test_the_sample_ships_with_the_package_and_is_written_where_asked(tmp_path: Path) -> None:
    """An installed ctxprec could not run its main job: the sample was not in the package.
    `ctxprec sample PATH` writes the packaged copy (the checkout's examples/ file links to it),
    and never replaces a file already there."""
    from ctxprec.cli.sample import sample_bytes

    assert (REPO / "examples" / "sample.parquet").read_bytes() == sample_bytes()
    target = tmp_path / "mine.parquet"
    done = cli("sample", target, cwd=tmp_path, stdout=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == sample_bytes()
    assert pl.read_parquet(target).height == pl.read_parquet(SAMPLE).height
    target.write_bytes(b"the user's own file")
    again = cli("sample", target, cwd=tmp_path)
    assert again.returncode == 2
    assert "never replaces" in again.stderr
    assert target.read_bytes() == b"the user's own file"
