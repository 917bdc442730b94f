"""`score --batch-api --audit-model M`: the audit judge's calls for its seeded sample of
rows go through the batch API of its own provider too, with batch state of their own
(OUTDIR/_ctxprec/batches-audit/), memoized like the first judge's, under the same --batch-wait
and --batch-fallback; the summary's corrected estimate and the judges' agreement are exactly an
online audited run's. Against the strict loopback batch fake (tests/fakes/batch_server.py): one
server per judge, the first judge wrong on 20 % of items, the audit judge the fake's truth, each
answering online with the same verdicts (the online run uses those endpoints)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.outdir.batches import BatchStore
from tests.fakes.batch_server import BatchFakeConfig, BatchFakeServer, BatchFakeThread
from tests.pipeline.test_audit import sampled_items
from tests.pipeline.test_row_fallback import labelled_log

OPENAI_KEY = "sk-test-batch-0123456789"
ANTHROPIC_KEY = "sk-ant-test-batch-0123456789"
FRACTION = 0.3


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXPREC_BATCH_POLL_S", "0.02")
    monkeypatch.setenv("CTXPREC_BATCH_POLL_MAX_S", "0.05")


@pytest.fixture
def judges(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BatchFakeServer, BatchFakeServer]]:
    """(the first judge's provider, OpenAI at OPENAI_BASE_URL; the audit judge's, Anthropic,
    reached by --audit-base-url only). Each checks its own key."""
    with (
        BatchFakeThread(BatchFakeConfig(flip_share=0.2, flip_seed=5, require_key=OPENAI_KEY))
        as small,
        BatchFakeThread(BatchFakeConfig(require_key=ANTHROPIC_KEY, seed=1)) as strong,
    ):  # fmt: skip
        monkeypatch.setenv("OPENAI_BASE_URL", small.url)
        monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
        yield small, strong


def flags(strong: BatchFakeServer, *more: object) -> list[str]:
    return [str(x) for x in ("--model", "openai/small", "--audit-model", "anthropic/strong",
                             "--audit-base-url", strong.root, "--audit-fraction", FRACTION,
                             "--progress", "off", *more)]  # fmt: skip


def run(
    monkeypatch: pytest.MonkeyPatch, memo: Path, src: Path, out: Path, *args: str
) -> int:  # fmt: skip
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(memo))
    return main(["score", str(src), "-o", str(out), *args])


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_batch_audit_equals_the_online_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    judges: tuple[BatchFakeServer, BatchFakeServer], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    small, strong = judges
    src = labelled_log(tmp_path / "log.parquet", rows=120)
    rows, items = sampled_items(src, FRACTION)
    total = int(pl.read_parquet(src)["contexts"].list.len().sum())
    online, batch = tmp_path / "online", tmp_path / "batch"
    assert run(monkeypatch, tmp_path / "m1", src, online, *flags(strong)) == 0
    assert (small.online_calls, strong.online_calls) == (total, items)
    assert small.stats.batches_created == strong.stats.batches_created == 0

    assert run(monkeypatch, tmp_path / "m2", src, batch, *flags(strong, "--batch-api")) == 0
    assert (small.online_calls, strong.online_calls) == (total, items)  # no online call more
    assert small.stats.batches_created == strong.stats.batches_created == 1
    assert small.stats.lines == total
    assert strong.stats.lines == items  # the sampled rows' items, once each
    assert strong.stats.rejected == small.stats.rejected == {}

    a, b = summary_of(online), summary_of(batch)
    assert b["estimate"]["reference"] == "audit:anthropic/strong"
    assert b["estimate"]["n_reference"] == rows
    assert b["estimate"] == a["estimate"]
    assert b["estimates"] == a["estimates"]
    assert b["audit"]["agreement"] == a["audit"]["agreement"]
    assert b["audit"]["agreement"]["mcnemar"]["discordant"] > 0  # the judges do differ
    assert (b["audit"]["rows"], b["audit"]["rows_scored"]) == (rows, rows)
    cols = ["id", "verdicts", "score", "audit_verdicts", "audit_score"]
    frame_a = pl.read_parquet(online / "*.parquet").select(cols).sort("id")
    frame_b = pl.read_parquet(batch / "*.parquet").select(cols).sort("id")
    assert frame_b.equals(frame_a)

    # the audit judge's batches: their own store, their report, their tokens at batch prices
    first = BatchStore.load(batch)
    audit = BatchStore.load(batch, audit=True)
    assert first.data["model"] == "openai/small"
    assert audit.data["model"] == "anthropic/strong"
    ids = {c["batch_id"] for c in audit.chunks.values()}
    assert ids.isdisjoint(c["batch_id"] for c in first.chunks.values())
    report = b["batch_api"]
    assert report["audit"]["provider"] == "anthropic"
    assert set(report["audit"]["batch_ids"]) == ids
    assert report["audit"]["lines_sent"] == items
    assert report["audit"]["input_tokens"] > 0
    assert b["audit"]["judges"]["audit"]["input_tokens"] == report["audit"]["input_tokens"]
    assert "audit judge batch ids" in (batch / "summary.md").read_text()
    # batch state is data: no key in it (each judge's key stayed with its own server)
    for path in (batch / "_ctxprec").rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert OPENAI_KEY.encode() not in text
            assert ANTHROPIC_KEY.encode() not in text

    # `ctxprec batches` finds both judges' batches
    capsys.readouterr()
    args = ["batches", str(batch), "--json", "--audit-base-url", strong.root]
    assert main(args) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {r["judge"] for r in listed} == {"judge", "audit"}
    assert {r["batch_id"] for r in listed if r["judge"] == "audit"} == ids

    # a re-run: every verdict of both judges is in the memo, no batch, no call
    again = tmp_path / "again"
    assert run(monkeypatch, tmp_path / "m2", src, again, *flags(strong, "--batch-api")) == 0
    assert small.stats.batches_created == strong.stats.batches_created == 1
    assert (small.online_calls, strong.online_calls) == (total, items)
    assert summary_of(again)["estimate"] == a["estimate"]


def test_row_mode_batches_one_line_per_sampled_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    judges: tuple[BatchFakeServer, BatchFakeServer],
) -> None:  # fmt: skip
    _, strong = judges
    src = labelled_log(tmp_path / "log.parquet", rows=80)
    rows, _ = sampled_items(src, FRACTION)
    online, batch = tmp_path / "online", tmp_path / "batch"
    assert run(monkeypatch, tmp_path / "m1", src, online, *flags(strong, "--mode", "row")) == 0
    calls = strong.online_calls
    more = ("--mode", "row", "--batch-api")
    assert run(monkeypatch, tmp_path / "m2", src, batch, *flags(strong, *more)) == 0
    assert strong.online_calls == calls
    assert strong.stats.lines == rows
    a, b = summary_of(online), summary_of(batch)
    assert b["estimate"] == a["estimate"]
    assert b["audit"]["agreement"] == a["audit"]["agreement"]


def test_batch_wait_covers_both_judges_and_the_same_command_collects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    judges: tuple[BatchFakeServer, BatchFakeServer], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    small, strong = judges
    small.config.hold = strong.config.hold = True
    src = labelled_log(tmp_path / "log.parquet", rows=60)
    out = tmp_path / "out"
    args = flags(strong, "--batch-api", "--batch-wait", "0")
    capsys.readouterr()
    assert run(monkeypatch, tmp_path / "m", src, out, *args) == 6
    said = capsys.readouterr().err
    assert "2 batches pending" in said  # the first judge's and the audit judge's
    assert not (out / "summary.json").exists()
    assert len(BatchStore.load(out, audit=True).live()) == 1
    assert main(["batches", str(out), "--audit-base-url", strong.root]) == 0
    listing = capsys.readouterr().out
    assert "audit judge" in listing
    # again while both are held: the same batches are polled, none is sent twice
    assert run(monkeypatch, tmp_path / "m", src, out, *args) == 6
    assert small.stats.batches_created == strong.stats.batches_created == 1
    small.release()
    strong.release()
    assert run(monkeypatch, tmp_path / "m", src, out, *args) == 0
    assert small.stats.batches_created == strong.stats.batches_created == 1
    assert summary_of(out)["estimate"]["reference"] == "audit:anthropic/strong"
    assert small.online_calls == strong.online_calls == 0


def test_fallback_online_sends_the_audit_judges_expired_lines_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    judges: tuple[BatchFakeServer, BatchFakeServer],
) -> None:  # fmt: skip
    small, strong = judges
    strong.config.p_expire = 0.3
    src = labelled_log(tmp_path / "log.parquet", rows=80)
    rows, items = sampled_items(src, FRACTION)
    out = tmp_path / "out"
    args = flags(strong, "--batch-api", "--batch-fallback", "online")
    assert run(monkeypatch, tmp_path / "m", src, out, *args) == 0
    assert strong.stats.batches_created == 1  # expired lines are not sent in a new batch ...
    assert 0 < strong.online_calls < items  # ... but online
    assert small.online_calls == 0
    audit = summary_of(out)["audit"]
    assert (audit["rows"], audit["rows_scored"]) == (rows, rows)


def test_an_audit_judge_without_a_batch_api_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = labelled_log(tmp_path / "log.parquet", rows=5)
    args = ["--model", "openai/gpt-4o-mini", "--audit-model", "offline/lenient", "--batch-api"]
    assert main(["score", str(src), "-o", str(tmp_path / "out"), *args]) == 2
    said = capsys.readouterr().err
    assert "audit judge 'offline/lenient'" in said
    assert not (tmp_path / "out").exists()


def test_estimate_prices_the_audit_calls_at_batch_prices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = labelled_log(tmp_path / "log.parquet", rows=100)
    _, items = sampled_items(src, FRACTION)
    config = tmp_path / "prices.toml"
    config.write_text(
        '[prices."openai/small"]\ninput_per_mtok = 1.0\noutput_per_mtok = 4.0\n'
        '[prices."anthropic/strong"]\ninput_per_mtok = 10.0\noutput_per_mtok = 40.0\n'
        "batch_input_per_mtok = 2.0\nbatch_output_per_mtok = 8.0\n"
    )
    base = ["estimate", str(src), "--config", str(config), "--model", "openai/small",
            "--audit-model", "anthropic/strong", "--audit-fraction", str(FRACTION),
            "--json"]  # fmt: skip
    assert main(base) == 0
    online = json.loads(capsys.readouterr().out)
    assert main([*base, "--batch-api"]) == 0
    batch = json.loads(capsys.readouterr().out)
    a, b = online["audit"], batch["audit"]
    assert a["calls"] == b["calls"] == items
    assert b["online_cost_usd"] == a["cost_usd"]
    # the audit model's own batch prices: a fifth of its online price here, not a half
    want = round_figure((a["input_tokens"] * 2.0 + a["output_tokens"] * 8.0) / 1e6)
    assert b["cost_usd"] == want
    assert b["cost_usd"] < a["cost_usd"]
    assert batch["cost_usd"] == pytest.approx(online["cost_usd"] / 2, abs=1e-6)
    assert batch["total_cost_usd"] == round(batch["cost_usd"] + b["cost_usd"], 6)
    assert main([*base[:-1], "--batch-api"]) == 0
    assert "batch API, audit judge:" in capsys.readouterr().out


def test_a_planted_audit_batch_state_sends_no_key_to_the_host_it_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    planted_host: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The audit judge's state is data too: its base URL, key variable and provider table are
    never followed; its batches are asked about where the command line and environment say."""
    host, asked = planted_host
    monkeypatch.setenv("CTXPREC_PLANTED_SECRET", "sk-planted-0123456789")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # ours: nothing listens
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    out = tmp_path / "out"
    state = out / "_ctxprec" / "batches-audit" / "state.json"
    state.parent.mkdir(parents=True)
    name = "c20260101T000000-00001-r1-0001"
    chunk = {
        "name": name, "round": 1, "lines": 3, "bytes": 10, "stage": "created",
        "written_at": 1.0, "not_before": 0.0, "intent_at": 1.0, "created_at": 1.0,
        "file_id": "file-x", "batch_id": "batch_x", "status": "in_progress", "answered": 0,
    }  # fmt: skip
    settings = {
        "model": "openai/strong", "base_url": host, "api_key_env": "CTXPREC_PLANTED_SECRET",
        "providers": [["evil", [["kind", "openai"], ["base_url", host]]]],
    }  # fmt: skip
    state.write_text(json.dumps({"settings": settings, "chunks": {name: chunk}}))
    quick = tmp_path / "no-retry.toml"  # a dead judge is otherwise waited for --retry-budget
    quick.write_text("[judge]\nretry_budget_s = 0\n")
    for extra, want in (([], 1), (["--audit-model", "evil/judge"], 0)):
        code = main(["batches", str(out), "--config", str(quick), *extra])
        err = capsys.readouterr().err
        assert asked == [], asked  # the planted host received nothing, no key went there
        assert code == want, err  # our endpoint unreachable; an unknown provider: listed
        assert "Traceback" not in err, err
        assert "sk-planted" not in err
        assert extra or f"names base URL {host}" in err, err
