"""`score --audit-model M --audit-fraction F`: a second judge on a seeded sample of whole rows. Its
calls are exactly the sampled rows' items (one call per sampled row with `--mode row`), none with F
= 0 and none on a re-run (the memo); the output carries its verdicts and score; the summary
estimates what it would say of every row and reports both judges' agreement and costs. Against real
fake judges on 127.0.0.1: one for each judge."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.flow.audit import audited
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread
from tests.fakes.runs import score
from tests.pipeline.test_row_fallback import labelled_log

JUDGE = ("--model", "openai/small")


@pytest.fixture
def servers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[FakeJudgeServer, FakeJudgeServer]]:
    """(the first judge, wrong on 20 % of items; the audit judge, the fake's truth)."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with (
        FakeJudgeThread(FakeJudgeConfig(flip_share=0.2, seed=5)) as small,
        FakeJudgeThread(FakeJudgeConfig()) as strong,
    ):
        monkeypatch.setenv("OPENAI_BASE_URL", small.url)
        yield small, strong


def audit_flags(strong: FakeJudgeServer, fraction: float, *more: object) -> list[object]:
    return ["--audit-model", "openai/strong", "--audit-base-url", strong.url,
            "--audit-fraction", fraction, *more]  # fmt: skip


def sampled_items(src: Path, fraction: float, seed: int = 0) -> tuple[int, int]:
    """(rows, items) of the input's rows in the audit sample."""
    frame = pl.read_parquet(src)
    rows = [c for i, c in zip(frame["id"], frame["contexts"], strict=True)
            if audited(i, fraction, seed)]  # fmt: skip
    return len(rows), sum(len(c) for c in rows)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_audit_calls_are_the_sampled_rows_items_and_a_rerun_makes_none(
    tmp_path: Path, servers: tuple[FakeJudgeServer, FakeJudgeServer],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    small, strong = servers
    src, out = labelled_log(tmp_path / "log.parquet", rows=200), tmp_path / "out"
    rows, items = sampled_items(src, 0.3)
    assert 30 < rows < 90
    assert score(src, "-o", out, *JUDGE, *audit_flags(strong, 0.3)) == 0
    total = int(pl.read_parquet(src)["contexts"].list.len().sum())
    assert small.stats.total == total  # the first judge: every item, as without an audit
    assert strong.stats.total == items  # the audit judge: the sampled rows' items, no more
    assert {b["model"] for b in strong.stats.bodies} == {"strong"}
    scored = pl.read_parquet(out / "*.parquet").sort("id")
    audited_rows = scored.filter(pl.col("audit_verdicts").is_not_null())
    assert audited_rows.height == rows
    # the audit judge is the fake's truth: its verdicts are the labels, its score their MAP
    labels = pl.read_parquet(src).select("id", "labels")
    both = audited_rows.join(labels, on="id")
    assert both["audit_verdicts"].to_list() == both["labels"].to_list()
    assert both["audit_score"].to_list() == [_map(x) for x in both["labels"].to_list()]
    s = summary_of(out)
    est = s["estimate"]
    assert est["reference"] == "audit:openai/strong"
    assert est["n_reference"] == rows
    assert est["n_rows"] == 200
    assert s["estimates"] == [est]
    truth = pl.read_parquet(src)["labels"].map_elements(_map, return_dtype=pl.Float64).mean()
    assert est["ci95"][0] <= truth <= est["ci95"][1]
    audit = s["audit"]
    assert audit["rows"] == rows
    assert audit["agreement"]["items"] == items
    assert audit["agreement"]["cohen_kappa"] < 1  # the first judge is wrong on some items
    assert audit["agreement"]["mcnemar"]["discordant"] > 0
    judges = audit["judges"]
    assert judges["audit"]["calls"] == items
    assert judges["judge"]["calls"] == total
    assert judges["audit"]["input_tokens"] == strong.stats.input_tokens
    assert judges["judge"]["input_tokens"] == small.stats.input_tokens
    said = "".join(capsys.readouterr())
    assert "audited by openai/strong" in said
    assert "kappa" in said
    assert "McNemar" in said
    assert "Audit judge" in (out / "summary.md").read_text()
    # a re-run: every verdict of both judges comes from the memo
    before = (small.stats.total, strong.stats.total)
    assert score(src, "-o", tmp_path / "again", *JUDGE, *audit_flags(strong, 0.3)) == 0
    assert (small.stats.total, strong.stats.total) == before
    again = summary_of(tmp_path / "again")
    assert again["estimate"]["mean"] == est["mean"]
    assert again["audit"]["judges"]["audit"]["calls"] == 0


def _map(labels: list[bool]) -> float:
    hits, total = 0, 0.0
    for i, rel in enumerate(labels):
        if rel:
            hits += 1
            total += hits / (i + 1)
    return round(total / hits, 2) if hits else 0.0


def test_fraction_zero_makes_no_audit_call(
    tmp_path: Path, servers: tuple[FakeJudgeServer, FakeJudgeServer]
) -> None:
    small, strong = servers
    src, out = labelled_log(tmp_path / "log.parquet", rows=40), tmp_path / "out"
    assert score(src, "-o", out, *JUDGE, *audit_flags(strong, 0)) == 0
    assert strong.stats.total == 0
    assert small.stats.total > 0
    s = summary_of(out)
    assert s["estimate"] is None
    assert s["estimates"] == []
    assert s["audit"]["rows"] == 0


def test_row_mode_audits_a_sampled_row_in_one_call(
    tmp_path: Path, servers: tuple[FakeJudgeServer, FakeJudgeServer]
) -> None:
    small, strong = servers
    src, out = labelled_log(tmp_path / "log.parquet", rows=120), tmp_path / "out"
    rows, items = sampled_items(src, 0.25)
    flags = (*JUDGE, "--mode", "row", *audit_flags(strong, 0.25))
    assert score(src, "-o", out, *flags) == 0
    assert strong.stats.total == rows  # one call per sampled row
    assert strong.stats.items.total() == items
    assert small.stats.total == 120
    scored = pl.read_parquet(out / "*.parquet")
    assert scored["audit_score"].is_not_null().sum() == rows
    assert summary_of(out)["estimate"]["n_reference"] == rows


def test_an_incremental_night_audits_its_own_new_rows_only(
    tmp_path: Path, servers: tuple[FakeJudgeServer, FakeJudgeServer]
) -> None:
    _, strong = servers
    night1, night2 = tmp_path / "n1.parquet", tmp_path / "n2.parquet"
    labelled_log(night2, rows=160)
    pl.read_parquet(night2).head(80).write_parquet(night1)
    out, flags = tmp_path / "out", (*JUDGE, *audit_flags(strong, 0.3))
    assert score(night1, "-o", out, *flags, "--incremental") == 0
    first = strong.stats.total
    assert first == sampled_items(night1, 0.3)[1]
    assert score(night2, "-o", out, *flags, "--incremental") == 0
    new = pl.read_parquet(night2).tail(80)
    new_items = sum(len(c) for i, c in zip(new["id"], new["contexts"], strict=True)
                    if audited(i, 0.3, 0))  # fmt: skip
    assert strong.stats.total - first == new_items
    s = summary_of(out)
    assert s["estimate"]["n_reference"] == sampled_items(night2, 0.3)[0]  # both nights'


def test_a_seed_draws_another_sample() -> None:
    ids = [f"r{i}" for i in range(2000)]
    a = {i for i in ids if audited(i, 0.1, 0)}
    b = {i for i in ids if audited(i, 0.1, 1)}
    assert 150 < len(a) < 250
    assert 150 < len(b) < 250
    assert a != b
    assert a == {i for i in ids if audited(i, 0.1, 0)}  # stable
    assert {i for i in ids if audited(i, 0.2, 0)} >= a  # a larger fraction keeps the rows


def test_the_audit_judge_shares_a_base_url_with_the_first_of_its_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --audit-base-url, an audit model of --model's provider goes where --base-url
    sends the first judge (one local server or proxy serving both)."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    src = labelled_log(tmp_path / "log.parquet", rows=50)
    _, items = sampled_items(src, 0.5)
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        flags = ("--base-url", server.url, "--audit-model", "openai/strong", "--audit-fraction",
                 0.5)  # fmt: skip
        assert score(src, "-o", tmp_path / "out", *JUDGE, *flags) == 0
        models = [b["model"] for b in server.stats.bodies]
    assert models.count("strong") == items
    assert models.count("small") == int(pl.read_parquet(src)["contexts"].list.len().sum())


def test_estimate_counts_the_audit_calls(
    tmp_path: Path, servers: tuple[FakeJudgeServer, FakeJudgeServer],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    small, strong = servers
    src = labelled_log(tmp_path / "log.parquet", rows=100)
    rows, items = sampled_items(src, 0.3)
    for mode, calls in (("item", items), ("row", rows)):
        capsys.readouterr()
        args = ["estimate", str(src), *JUDGE, "--mode", mode, "--json"]
        assert main([*args, *map(str, audit_flags(strong, 0.3))]) == 0
        est = json.loads(capsys.readouterr().out)
        assert main(args) == 0
        plain = json.loads(capsys.readouterr().out)
        assert est["audit_calls"] == calls
        assert est["calls"] == plain["calls"]
        assert est["input_tokens"] == plain["input_tokens"]  # the first judge's, apart
        assert est["audit"]["calls"] == calls
        assert est["audit"]["input_tokens"] > 0
        assert main([*args[:-1], *map(str, audit_flags(strong, 0.3))]) == 0
        assert f"audit judge openai/strong: {rows:,} rows sampled" in capsys.readouterr().out
    assert small.stats.total == strong.stats.total == 0


def test_the_audit_settings_come_from_the_config_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[judge]\naudit_model = "openai/gpt-4.1"\naudit_fraction = 0.1\n')
    cfg = load_config(path, {}, env={})
    assert (cfg.judge.audit_model, cfg.judge.audit_fraction) == ("openai/gpt-4.1", 0.1)
    env = {"CTXPREC_AUDIT_MODEL": "openai/o3", "CTXPREC_AUDIT_FRACTION": "0.2"}
    cfg = load_config(path, {}, env=env)
    assert (cfg.judge.audit_model, cfg.judge.audit_fraction) == ("openai/o3", 0.2)
    cfg = load_config(path, {"judge.audit_fraction": 0.3}, env=env)
    assert cfg.judge.audit_fraction == 0.3


def test_run_score_takes_the_audit_options(tmp_path: Path) -> None:
    """The Python API: run_score(..., audit_model=, audit_fraction=) with the offline judges."""
    from ctxprec import Config, run_score
    from ctxprec.storage.core.errors import ConfigError
    from ctxprec.storage.files.objpath import out_path
    from tests.fakes.inputs import SAMPLE

    cfg = Config(run=dataclasses.replace(Config().run, cache_dir=tmp_path / "memo"))
    out = out_path(tmp_path / "out")
    kw = {"audit_model": "offline/lenient", "audit_fraction": 0.5, "progress": "off"}
    result = anyio.run(lambda: run_score(str(SAMPLE), out, cfg, **kw))
    ids = pl.read_parquet(SAMPLE)["id"].to_list()
    want = sum(1 for i in ids if audited(i, 0.5, 0))
    assert result.summary["estimate"]["reference"] == "audit:offline/lenient"
    assert result.summary["audit"]["rows"] == want
    with pytest.raises(ConfigError, match="audit_fraction"):
        anyio.run(lambda: run_score(str(SAMPLE), out, cfg, audit_fraction=2))


def test_run_evals_with_labels_gives_the_corrected_estimate() -> None:
    """run_evals: data items may carry `labels` (one per context item); the result's
    `estimates` holds each scorer's corrected mean, as summary.json's `estimate`."""
    from ctxprec import create_context_precision_scorer, run_evals

    scorer = create_context_precision_scorer("offline", {"context": []})
    data = [{"input": f"who wrote book {i}?", "ground_truth": f"author {i}",
             **({"labels": [False, True]} if i % 2 else {})} for i in range(30)]  # fmt: skip

    async def target(query: str) -> dict:
        i = query.split()[-1].rstrip("?")
        return {"output": "", "context": [f"author {i} wrote book {i}", "nothing here"]}

    result = anyio.run(lambda: run_evals(data=data, scorers=[scorer], target=target))
    est = result.estimates[scorer.id]
    assert est is not None
    assert est["reference"] == "labels"
    assert (est["n_reference"], est["n_rows"]) == (15, 30)
    assert result.scores[scorer.id] == pytest.approx(1.0)  # the judge: the first item relevant
    assert est["mean"] == pytest.approx(0.5)  # the labels: the second one, MAP 0.5
    without = anyio.run(lambda: run_evals(data=data[:1], scorers=[scorer], target=target))
    assert without.estimates[scorer.id] is None


def test_the_audit_estimate_covers_the_strong_judges_mean_by_simulation() -> None:
    """Coverage of the audit estimate, end to end through the product's sampling (the row-id hash),
    MAP stage, audit_score and summary estimate (bench/audit_coverage.py): 200 seeded worlds of
    2,000 rows whose strong judge's verdicts are the truth, a first judge missing 10 % of relevant
    items and calling 25 % of the others relevant, 5 % audited. The corrected CI covers the strong
    judge's mean over every row in >= 93 % of them; the first judge's own CI almost never does."""
    from bench.audit_coverage import coverage, synthetic

    res = coverage(synthetic(2000), 200, (0.05,), miss=0.10, false=0.25)
    (row,) = res["table"]
    assert 80 < row["audited_rows_mean"] < 120  # the hash draws about F of the rows
    assert row["worlds_without_ci"] == 0
    assert row["ppi_coverage"] >= 0.93, row
    assert row["judge_coverage"] <= 0.10, row
    assert res["judge_bias"] > 0.05  # the first judge is biased, so covering means correcting
