"""The README's "Nightly quality gate" recipe and A/B example run as written: every `ctxprec`
command of the section, against a loopback judge with configs/openai.toml, and the exit codes
are the ones the figures they wrote call for."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread

NIGHT, LAST = "2026-11-29", "2026-11-28"


def section() -> str:
    """docs/nightly.md's quality gate section and docs/comparing.md (the A/B commands)."""
    text = (REPO / "docs" / "nightly.md").read_text(encoding="utf-8")
    gate = text[text.index("## Nightly quality gate") :]
    return gate + (REPO / "docs" / "comparing.md").read_text(encoding="utf-8")


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", section(), flags=re.S)


def commands(block: str, **env: str) -> list[list[str]]:
    """The `ctxprec` command lines of a block: continuations joined, shell tails cut off,
    $VARS filled in."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("ctxprec "):
            continue
        line = re.split(r"\s\|\|\s|\s>\s", line)[0]
        for name, value in env.items():
            line = line.replace(f"${name}", value)
        out.append(shlex.split(line)[1:])
    return out


def hotpot_rows(hotpot: Path, n: int = 30) -> pl.DataFrame:
    df = pl.read_parquet(hotpot).head(n)
    return df.select(
        pl.col("id").alias("query_id"),
        pl.col("question").alias("query"),
        pl.col("ground_truth").alias("expected_output"),
        "contexts",
    )


@pytest.fixture
def workdir(hotpot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "openai.toml", tmp_path / "configs")
    (tmp_path / "logs").mkdir()
    (tmp_path / "ab").mkdir()
    rows = hotpot_rows(hotpot)
    for dt, reverse in ((LAST, False), (NIGHT, True)):
        night = rows.with_columns(
            (pl.lit(f"{dt}/") + pl.col("query_id")).alias("id"), pl.lit(dt).alias("dt")
        )
        if reverse:
            night = night.with_columns(pl.col("contexts").list.reverse())
        night.write_parquet(tmp_path / "logs" / f"{dt}.parquet")
    bm25 = rows.with_columns(pl.col("query_id").alias("id"))
    dense = bm25.with_columns(pl.col("contexts").list.reverse())
    bm25.write_parquet(tmp_path / "ab" / "bm25.parquet")
    dense.write_parquet(tmp_path / "ab" / "dense.parquet")
    both = [
        frame.with_columns(
            (pl.lit(f"{name}/") + pl.col("query_id")).alias("id"),
            pl.lit(name).alias("retriever"),
            pl.Series("topic", ["people", "places", "things"] * 10),
        )
        for name, frame in (("bm25", bm25), ("dense", dense))
    ]
    pl.concat(both).write_parquet(tmp_path / "ab" / "both.parquet")
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-readme-gate")
        monkeypatch.chdir(tmp_path)
        yield tmp_path


def night_mean(out: Path, dt: str) -> float:
    rows = pl.read_parquet(out / f"dt={dt}" / "*.parquet")
    mean = rows.filter(pl.col("status") != "failed").get_column("score").mean()
    assert isinstance(mean, float)
    return mean


@pytest.mark.slow
def test_nightly_recipe_runs_as_written(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = bash_blocks()[0]
    first = commands(script, NIGHT=LAST)[0]  # the night before: its score run only
    assert first[0] == "score"
    assert "--fail-under" in first
    code = main(first)
    assert code == (5 if night_mean(workdir / "scores", LAST) < 0.6 else 0)
    score_cmd, compare_cmd, summary_cmd = commands(script, NIGHT=NIGHT, LAST=LAST)
    threshold = float(score_cmd[score_cmd.index("--fail-under") + 1])
    code = main(score_cmd)  # judged on tonight's rows only (incremental)
    assert code == (5 if night_mean(workdir / "scores", NIGHT) < threshold else 0)

    code = main(compare_cmd)
    report = json.loads((workdir / "reports" / NIGHT / "compare.json").read_text())
    drop = float(compare_cmd[compare_cmd.index("--fail-drop") + 1])
    crossed = report["mean_delta"] < -drop and report["ci95"][1] < 0
    assert code == (5 if crossed else 0)
    assert report["n_pairs"] == 30
    assert report["left_out"]["total"] == 0
    assert main(summary_cmd) == 0
    assert (
        len(json.loads((workdir / "scores" / "summary.json").read_text())["trend"]["nights"]) == 2
    )

    # the script's date lines, with the dates Airflow passes, give the night before
    dates = "\n".join(x for x in script.splitlines() if x.startswith(("NIGHT=", "LAST=")))
    done = subprocess.run(
        ["sh", "-c", f'{dates}\necho "$LAST"', "sh", NIGHT], capture_output=True, text=True
    )
    assert done.stdout.strip() == LAST
    airflow = re.findall(r"```python\n(.*?)```", section(), flags=re.S)[0]
    assert "nightly.sh {{ ds }} {{ macros.ds_add(ds, -1) }}" in airflow
    assert "nightly.sh {{ ds }} {{ macros.ds_add(ds, -1) }}" in script  # the same call
    assert "15 2 * * * /srv/ctxprec/nightly.sh" in script


@pytest.mark.slow
def test_ab_example_runs_as_written(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmds = commands(bash_blocks()[1])
    assert len(cmds) == 5
    for cmd in cmds[:3]:
        assert main(cmd) == 0
    report = json.loads((workdir / "ab" / "report" / "compare.json").read_text())
    assert report["n_pairs"] == 30
    assert (workdir / "ab" / "report" / "compare.md").is_file()
    assert main(cmds[3]) == 0
    capsys.readouterr()
    assert main(cmds[4]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["n_pairs"] == 30  # paired on query_id across the two retrievers
    assert one["mean_delta"] == pytest.approx(report["mean_delta"], abs=1e-12)
    assert {g["group"] for g in one["by_group"]["groups"]} == {"people", "places", "things"}


@pytest.mark.slow
def test_judge_against_judge_example_runs_as_written(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmds = commands(bash_blocks()[2])
    assert [c[0] for c in cmds] == ["score", "score", "compare"]
    for cmd in cmds[:2]:
        assert main(cmd) == 0
    capsys.readouterr()
    assert main(cmds[2]) == 0
    g = json.loads(capsys.readouterr().out)["judge_agreement"]
    assert g["judges_differ"] is True  # two models
    items = pl.read_parquet(workdir / "ab" / "bm25.parquet")["contexts"].list.len().sum()
    assert g["items"] == items
    assert g["agreement"] == 1.0  # the same loopback judge behind both model names
