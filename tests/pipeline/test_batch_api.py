"""`ctxprec score --batch-api` against the strict loopback fake of both providers' batch APIs
(tests/fakes/batch_server.py): scores equal the MAP of the server's verdicts with no online call,
expired/errored lines and failed batches are sent again (and only them), a kill -9 while waiting
resumes without a second batch, cancellation, limits that split a run, exit code 6.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.connectors.judges.batch.client import CUSTOM_ID, BatchHttp, custom_id_for
from ctxprec.connectors.judges.retry import RetryClock, RetryPolicy
from ctxprec.connectors.judges.transport import AiohttpTransport, multipart_form
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.outdir.batches import BatchStore
from tests.fakes.batch_server import BatchFakeConfig, BatchFakeServer, BatchFakeThread
from tests.fakes.inputs import HOTPOT_MAP, REPO, documentation
from tests.fakes.judge_server import FakeJudgeConfig, expected_verdict
from tests.fakes.runs import fake_request, fake_stats, server_process

PROVIDERS = ["openai", "anthropic"]


@pytest.fixture
def rows(hotpot: Path, tmp_path: Path) -> Path:
    """25 HotpotQA rows (about 250 context items) as their own file."""
    path = tmp_path / "rows.parquet"
    pl.read_parquet(hotpot).head(25).write_parquet(path)
    return path


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXPREC_BATCH_POLL_S", "0.02")
    monkeypatch.setenv("CTXPREC_BATCH_POLL_MAX_S", "0.05")


def serve(monkeypatch: pytest.MonkeyPatch, config: BatchFakeConfig) -> BatchFakeThread:
    thread = BatchFakeThread(config)
    server = thread.__enter__()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.root)  # as the Anthropic SDK takes it
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-batch-0123456789")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-batch-0123456789")
    return thread


@pytest.fixture
def fake(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[BatchFakeServer]:
    config = getattr(request, "param", None) or BatchFakeConfig()
    thread = serve(monkeypatch, config)
    try:
        yield thread.server
    finally:
        thread.__exit__(None, None, None)


def score(src: Path, out: Path, provider: str, *extra: object) -> int:
    args = ["score", src, "-o", out, "--model", f"{provider}/judge-1", *HOTPOT_MAP, "--batch-api"]
    return main([*map(str, args), "--progress", "off", *map(str, extra)])


def check_rows(out: Path, src: Path, *, failed_ok: bool = False) -> pl.DataFrame:
    """Every row equals the MAP of the server's verdicts (or failed, when allowed)."""
    source = pl.read_parquet(src).select("id", "contexts")
    got = pl.read_parquet(out / "**/*.parquet").join(source, on="id")
    assert got.height == source.height
    for row in got.iter_rows(named=True):
        if failed_ok and row["status"] == "failed":
            continue
        verdicts = [expected_verdict(item, FakeJudgeConfig()) for item in row["contexts"]]
        assert row["status"] == "ok", row["error"]
        assert row["verdicts"] == verdicts
        assert row["score"] == map_score(verdicts)
    return got


def distinct_items(src: Path) -> int:
    return pl.read_parquet(src).explode("contexts").select("question", "contexts").n_unique()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_round_trip_equals_map_of_server_verdicts_without_online_calls(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    assert fake.online_calls == 0
    assert fake.stats.batches_created == 1
    assert fake.stats.lines == distinct_items(rows)  # one line per distinct (query, item)
    assert max(fake.stats.pairs.values()) == 1
    summary = json.loads((out / "summary.json").read_text())
    batch = summary["batch_api"]
    assert batch["provider"] == provider
    assert len(batch["batch_ids"]) == 1
    assert batch["lines_sent"] == fake.stats.lines
    assert batch["input_tokens"] > 0
    assert "Provider batch API" in (out / "summary.md").read_text()
    assert summary["tokens"]["paid_input_this_run"] == batch["input_tokens"]
    scored = pl.read_parquet(out / "*.parquet")  # the rows carry what the batches were paid
    assert scored["paid_input_tokens"].sum() == batch["input_tokens"]
    assert scored["paid_output_tokens"].sum() == batch["output_tokens"]
    # a second run finds every verdict in the memo: no batch, no call
    assert score(rows, tmp_path / "again", provider) == 0
    assert fake.stats.batches_created == 1
    assert fake.online_calls == 0


def test_results_come_back_shuffled_and_land_on_their_items(
    rows: Path, tmp_path: Path, fake: BatchFakeServer
) -> None:
    assert score(rows, tmp_path / "out", "openai") == 0
    batch = next(iter(fake._batches.values()))
    sent = [line.custom_id for line in batch.lines]
    content = fake._files[str(batch.output_file_id)]
    returned = [json.loads(x)["custom_id"] for x in content.splitlines()]
    assert sorted(returned) == sorted(sent)
    assert returned != sent
    check_rows(tmp_path / "out", rows)


@pytest.mark.parametrize(
    "fake", [BatchFakeConfig(p_expire=0.15, p_line_5xx=0.05, seed=7)], indirect=True
)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_expired_and_errored_lines_are_sent_again_and_only_them(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    assert fake.online_calls == 0
    assert fake.stats.batches_created >= 2  # the first batch expired with partial output
    assert fake.stats.lines / distinct_items(rows) <= 1.3
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert run["engine"]["batch_api"]["rounds"] >= 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_rejected_line_fails_its_item_with_the_providers_cause(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    bad = pl.read_parquet(rows).get_column("contexts")[3][1]
    fake.config.bad_items = {bad}
    out = tmp_path / "out"
    assert score(rows, out, provider) == 1
    got = check_rows(out, rows, failed_ok=True)
    failed = got.filter(pl.col("status") == "failed")
    assert failed.height >= 1
    cause = "http_400" if provider == "openai" else "invalid_request_error"
    for row in failed.iter_rows(named=True):
        assert bad in row["contexts"]
        assert row["error"].startswith(cause)
        assert "bad item" in row["error"]
        assert row["verdicts"][row["contexts"].index(bad)] is None  # not "not relevant"
    assert fake.stats.items[bad] == 1  # a 4xx is not retried
    assert fake.online_calls == 0


@pytest.mark.parametrize("fake", [BatchFakeConfig(fail_batches=1)], indirect=True)
def test_a_batch_failed_as_a_whole_is_submitted_again(
    rows: Path, tmp_path: Path, fake: BatchFakeServer
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, "openai") == 0
    check_rows(out, rows)
    assert fake.stats.batches_created == 2  # token_limit_exceeded, then the same lines again
    assert fake.stats.lines == distinct_items(rows)  # the failed batch enqueued nothing
    assert fake.online_calls == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_limits_split_a_run_into_several_batches(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("CTXPREC_BATCH_MAX_LINES", "50")
    out = tmp_path / "out"
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    n = distinct_items(rows)
    assert fake.stats.batches_created == math.ceil(n / 50)
    assert all(len(b.lines) <= 50 for b in fake._batches.values())
    assert fake.stats.lines == n


@pytest.mark.parametrize("fake", [BatchFakeConfig(hold=True)], indirect=True)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_batch_wait_exits_6_and_the_same_command_collects_later(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    assert score(rows, out, provider, "--batch-wait", "0") == 6
    err = capsys.readouterr().err
    assert "1 batch pending" in err
    assert "run the same command later" in err
    assert not (out / "_SUCCESS").exists()
    assert main(["batches", str(out)]) == 0
    listing = capsys.readouterr().out
    assert "in_progress" in listing or "validating" in listing
    assert "/250" in listing
    assert score(rows, out, provider, "--batch-wait", "0.05") == 6  # still running
    fake.release()
    assert score(rows, out, provider, "--batch-wait", "1h") == 0
    check_rows(out, rows)
    assert fake.stats.batches_created == 1
    assert fake.online_calls == 0


@pytest.mark.parametrize("fake", [BatchFakeConfig(hold=True)], indirect=True)
def test_batches_are_asked_where_the_command_line_says_never_where_the_state_says(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The state's base URL was followed. Now the environment's (or
    --base-url) is asked; the state's differing one is reported and receives nothing."""
    out = tmp_path / "out"
    assert score(rows, out, "openai", "--batch-wait", "0") == 6
    url = os.environ["OPENAI_BASE_URL"]
    assert BatchStore.load(out).data["settings"]["base_url"] == url  # what the run resolved
    capsys.readouterr()
    assert main(["batches", str(out)]) == 0  # same environment: no complaint, the fake answers
    listed = capsys.readouterr()
    assert "in_progress" in listed.out or "validating" in listed.out
    assert "not used" not in listed.err
    polls = fake.stats.polls
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    quick = tmp_path / "no-retry.toml"  # a dead judge is otherwise waited for --retry-budget
    quick.write_text("[judge]\nretry_budget_s = 0\n")
    assert main(["batches", str(out), "--config", str(quick)]) == 1  # endpoint unreachable
    listed = capsys.readouterr()
    assert f"names base URL {url}; not used" in listed.err
    assert "127.0.0.1:9" in listed.err
    assert fake.stats.polls == polls  # the state's host was not asked
    assert main(["batches", str(out), "--model", "openai/judge-1", "--base-url", url]) == 0
    assert fake.stats.polls > polls  # the command line's URL is asked


def test_a_planted_batch_state_sends_no_key_to_the_host_it_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    planted_host: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A state.json naming another loopback host, another key variable and a provider table of
    its own: that host receives no request (and so no key); the line says what was ignored."""
    host, asked = planted_host
    monkeypatch.setenv("CTXPREC_PLANTED_SECRET", "sk-planted-0123456789")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # ours: nothing listens
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-batch-0123456789")
    out = tmp_path / "out"
    state = out / "_ctxprec" / "batches" / "state.json"
    state.parent.mkdir(parents=True)
    chunk = {"name": "c0", "stage": "sent", "batch_id": "batch_x", "lines": 3, "round": 0}
    planted_settings = {
        "model": "evil/judge", "base_url": host, "api_key_env": "CTXPREC_PLANTED_SECRET",
        "providers": [["evil", [["kind", "openai"], ["base_url", host]]]],
    }  # fmt: skip
    state.write_text(json.dumps({"settings": planted_settings, "chunks": {"c0": chunk}}))
    quick = tmp_path / "no-retry.toml"  # a dead judge is otherwise waited for --retry-budget
    quick.write_text("[judge]\nretry_budget_s = 0\n")
    for extra in ([], ["--model", "openai/judge-1"]):
        code = main(["batches", str(out), "--config", str(quick), *extra])
        err = capsys.readouterr().err
        assert asked == [], asked  # the planted host received nothing, no key went there
        assert code in (0, 1, 2), err  # listed, our endpoint unreachable, or refused
        assert "Traceback" not in err, err
        assert "sk-planted" not in err
        assert code == 2 or f"names base URL {host}" in err, err


@pytest.mark.parametrize("fake", [BatchFakeConfig(hold=True)], indirect=True)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_cancel_then_the_same_command_sends_only_the_unanswered_lines(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    assert score(rows, out, provider, "--batch-wait", "0") == 6
    time.sleep(0.3)  # the held batch has answered half its lines by now
    assert main(["batches", str(out), "--cancel", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in listed] == ["cancelling" if provider == "openai" else "canceling"]
    assert fake.stats.cancels == 1
    fake.release()
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    n = distinct_items(rows)
    assert fake.stats.batches_created == 2
    assert n < fake.stats.lines < 2 * n  # the cancelled batch answered part of its lines
    assert max(fake.stats.pairs.values()) == 2


@pytest.mark.parametrize("fake", [BatchFakeConfig(hold=True)], indirect=True)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_crash_between_create_and_record_does_not_create_a_second_batch(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, provider, "--batch-wait", "0") == 6
    store = BatchStore.load(out)
    (chunk,) = store.chunks.values()
    # as if killed after the batch was created and before its id was written
    stage = "uploaded" if provider == "openai" else "intent"
    store.update(chunk["name"], stage=stage, batch_id=None)
    fake.release()
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    assert fake.stats.batches_created == 1
    assert fake.stats.list_calls >= 1


@pytest.mark.parametrize("fake", [BatchFakeConfig(p_expire=0.3, seed=3)], indirect=True)
def test_fallback_online_sends_expired_lines_online(
    rows: Path, tmp_path: Path, fake: BatchFakeServer
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, "openai", "--batch-fallback", "online") == 0
    check_rows(out, rows)
    assert fake.stats.batches_created == 1
    expired = sum(1 for line in next(iter(fake._batches.values())).lines if line.fate == "expire")
    assert expired > 0
    assert fake.online_calls == expired


def test_per_row_mode_through_batches(rows: Path, tmp_path: Path, fake: BatchFakeServer) -> None:
    out = tmp_path / "out"
    assert score(rows, out, "anthropic", "--mode", "row") == 0
    check_rows(out, rows)
    assert fake.stats.lines == pl.read_parquet(rows).height
    assert fake.online_calls == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reason_llm_asks_the_judge_for_each_rows_reason(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    """Verdicts come from the batch; each scored row's reason is one call of the online judge."""
    out = tmp_path / "out"
    assert score(rows, out, provider, "--reason", "llm") == 0
    got = check_rows(out, rows)
    assert fake.stats.batches_created == 1
    assert fake.stats.lines == distinct_items(rows)
    reason_bodies = [
        b
        for b in fake.online.stats.bodies
        if "Write a concise explanation" in json.dumps(b["messages"])
    ]
    assert reason_bodies
    assert fake.online_calls == len(reason_bodies)
    assert not any(r.startswith("Score ") for r in got["reason"].to_list())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"]["reason_calls"] == len(reason_bodies)
    # a second run takes verdicts and reasons from the memo: no batch, no call
    calls = fake.online_calls
    assert score(rows, tmp_path / "again", provider, "--reason", "llm") == 0
    assert fake.stats.batches_created == 1
    assert fake.online_calls == calls


def test_anthropic_base_url_with_trailing_v1_is_tolerated(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)  # …/v1
    assert score(rows, tmp_path / "out", "anthropic") == 0
    check_rows(tmp_path / "out", rows)


def test_batch_api_needs_a_provider_with_one(
    rows: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["score", str(rows), "-o", str(out), *HOTPOT_MAP, "--batch-api"]) == 2
    assert "batch API" in capsys.readouterr().err
    assert not out.exists()
    args = ["score", str(rows), "-o", str(out), *HOTPOT_MAP, "--batch-wait", "1h"]
    assert main(args) == 2
    assert "--batch-api" in capsys.readouterr().err
    config = tmp_path / "c.toml"
    config.write_text('[judge]\nmodel = "offline"\nbatch_api = true\n')
    assert main(["score", str(rows), "-o", str(out), *HOTPOT_MAP, "--config", str(config)]) == 2


def test_estimate_at_batch_prices(
    rows: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[judge]\nmodel = "openai/gpt-4o-mini"\n\n[prices."openai/gpt-4o-mini"]\n'
        "input_per_mtok = 0.15\noutput_per_mtok = 0.60\n"
    )
    base = ["estimate", str(rows), *HOTPOT_MAP, "--config", str(config), "--json"]
    assert main(base) == 0
    online = json.loads(capsys.readouterr().out)
    assert main([*base, "--batch-api"]) == 0
    batch = json.loads(capsys.readouterr().out)
    assert batch["cost_usd"] == pytest.approx(online["cost_usd"] / 2, abs=1e-4)  # 4 decimals
    assert batch["batch_api"]["saving_usd"] == pytest.approx(online["cost_usd"] / 2, abs=1e-4)
    config.write_text(
        config.read_text() + "batch_input_per_mtok = 0.05\nbatch_output_per_mtok = 0.2\n"
    )
    assert main([*base[:-1], "--batch-api"]) == 0
    text = capsys.readouterr().out
    assert "batch API: $" in text
    assert "saving" in text
    assert "24 h" in text


def test_custom_ids_fit_the_providers_pattern(fake: BatchFakeServer) -> None:
    key = "v1-" + "ab" * 32
    for keys in ([key], [key, key.replace("a", "c")]):
        cid = custom_id_for(keys)
        assert CUSTOM_ID.match(cid)
        assert len(cid) <= 64
    body = json.dumps(
        {
            "requests": [
                {"custom_id": "x" * 65, "params": {"model": "m", "max_tokens": 5, "messages": []}}
            ]
        }
    ).encode()
    request = urllib.request.Request(
        f"{fake.root}/v1/messages/batches", data=body, method="POST",
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 400
    assert "at most 64 characters" in caught.value.read().decode()


# ---------------------------------------------------------------- kill -9 while waiting


@pytest.fixture
def fake_process() -> Iterator[str]:
    with server_process("tests.fakes.batch_server", "--hold", "--p-expire", "0.1") as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("provider", PROVIDERS)
def test_kill_9_while_waiting_then_the_same_command_resumes(
    rows: Path, tmp_path: Path, fake_process: str, provider: str
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = dict(os.environ)
    env.update(
        OPENAI_BASE_URL=fake_process, ANTHROPIC_BASE_URL=fake_process.removesuffix("/v1"),
        OPENAI_API_KEY="sk-test-kill", ANTHROPIC_API_KEY="sk-ant-test-kill",
        CTXPREC_CACHE_DIR=str(cache), CTXPREC_BATCH_POLL_S="0.05",
        CTXPREC_BATCH_POLL_MAX_S="0.1",
    )  # fmt: skip
    command = [sys.executable, "-m", "ctxprec.cli.main", "score", str(rows), "-o", str(out),
               "--model", f"{provider}/judge-1", *HOTPOT_MAP, "--batch-api",
               "--progress", "off"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the batch is created and recorded
        store = BatchStore.load(out) if (out / "_ctxprec" / "batches" / "state.json").exists() \
            else None  # fmt: skip
        if store is not None and any(c.get("batch_id") for c in store.chunks.values()):
            break
        time.sleep(0.05)
    time.sleep(0.3)  # it is polling now
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert fake_stats(fake_process)["batches_created"] == 1
    assert not (out / "_SUCCESS").exists()
    fake_request(fake_process, "/_fake/release", "POST")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    check_rows(out, rows)
    stats = fake_stats(fake_process)
    lines = int(stats["lines"])
    assert stats["online_calls"] == 0
    assert lines / distinct_items(rows) <= 1.3
    first = BatchStore.load(out)
    rounds = [int(c["round"]) for c in first.chunks.values()]
    # one batch for the first round; later rounds hold only the expired lines
    assert rounds.count(1) == 1
    assert int(stats["batches_created"]) == len(rounds)


def test_readme_batch_commands_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = documentation()
    block = next(
        b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S) if "ctxprec batches" in b
    )
    commands = [line for line in block.splitlines() if line.startswith("ctxprec ")]
    assert [c.split()[1] for c in commands] == ["estimate", "score", "batches", "score", "batches"]
    thread = serve(monkeypatch, BatchFakeConfig(hold=True))
    try:
        codes = []
        for i, line in enumerate(commands):
            argv = [
                str(REPO / a) if a.startswith(("examples/", "configs/")) else a
                for a in shlex.split(line.replace("out/batch", str(tmp_path / "batch")))[1:]
            ]
            if i == 3:  # "tomorrow": the provider has answered
                thread.server.release()
            codes.append(main(argv))
        assert codes == [0, 6, 0, 0, 0]
        assert thread.server.stats.batches_created == 1
        assert thread.server.online_calls == 0
        assert (tmp_path / "batch" / "_SUCCESS").exists()
        out = capsys.readouterr().out
        assert "batch API: $" in out
        assert "batch API: 34 lines in 1 batches" in out
    finally:
        thread.__exit__(None, None, None)


def test_no_memo_and_incremental_runs_through_batches(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.parquet"
    pl.read_parquet(rows).head(10).write_parquet(first)
    out = tmp_path / "out"
    assert score(first, out, "openai", "--no-memo", "--incremental", "--quiet") == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(line["batch_api"]["batch_ids"]) == 1
    sent = fake.stats.lines
    assert sent == distinct_items(first)
    # the whole file, incrementally: only the 15 new rows' items are sent
    assert score(rows, out, "openai", "--no-memo", "--incremental") == 0
    check_rows(out, rows)
    assert fake.stats.lines - sent == distinct_items(rows) - distinct_items(first)
    assert fake.online_calls == 0


@pytest.mark.parametrize("fake", [BatchFakeConfig(hold=True)], indirect=True)
def test_quiet_pending_run_prints_one_json_line(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert score(rows, tmp_path / "out", "openai", "--batch-wait", "0", "--quiet") == 6
    line = json.loads(capsys.readouterr().out)
    assert "1 batch pending" in line["batches_pending"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unreadable_replies_are_asked_afresh_once(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    fake.config.p_garbage = 0.1
    out = tmp_path / "out"
    assert score(rows, out, provider) in (0, 1)
    got = check_rows(out, rows, failed_ok=True)  # the rest: MAP of the server's verdicts
    errors = got.filter(pl.col("status") == "failed").get_column("error").to_list()
    assert all(e.startswith("unparseable") for e in errors)  # unreadable twice in a row
    assert fake.stats.batches_created == 2  # one fresh ask, no more
    assert fake.stats.lines / distinct_items(rows) <= 1.3
    fake.config.p_garbage = 1.0  # a model that never answers readably: two lines, then failed
    few = tmp_path / "few.parquet"
    pl.read_parquet(rows).tail(2).write_parquet(few)
    before = fake.stats.lines
    assert score(few, tmp_path / "few", provider, "--cache-dir", tmp_path / "other") == 1
    got = pl.read_parquet(tmp_path / "few" / "*.parquet")
    assert got.get_column("status").to_list() == ["failed", "failed"]
    assert all(e.startswith("unparseable") for e in got.get_column("error").to_list())
    assert fake.stats.lines - before == 2 * distinct_items(few)


def test_summary_prices_the_run_at_batch_prices(
    rows: Path, tmp_path: Path, fake: BatchFakeServer
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[prices."openai/judge-1"]\ninput_per_mtok = 1.0\noutput_per_mtok = 4.0\n')
    out = tmp_path / "out"
    assert score(rows, out, "openai", "--config", config) == 0
    summary = json.loads((out / "summary.json").read_text())
    batch = summary["batch_api"]
    t_in, t_out = batch["input_tokens"], batch["output_tokens"]
    assert batch["cost_usd"] == round_figure((t_in * 0.5 + t_out * 2.0) / 1e6)
    assert batch["online_cost_usd"] == round_figure((t_in * 1.0 + t_out * 4.0) / 1e6)
    assert batch["saving_usd"] == pytest.approx(batch["cost_usd"], abs=1e-4)
    assert summary["cost_usd"]["paid_this_run"] == pytest.approx(batch["cost_usd"], abs=5e-5)
    assert batch["took_s"] is not None
    assert batch["batch_ids"]
    md = (out / "summary.md").read_text()
    assert "saving usd" in md
    assert batch["batch_ids"][0] in md
    # the estimate made before the run is at batch prices too: the ratio is about 1, not 0.5
    ratio = summary["estimate_vs_actual"]["cost_usd"]["ratio"]
    assert 0.7 < ratio < 1.5


@pytest.mark.parametrize("fake", [BatchFakeConfig(poll_errors=2, results_url_lag=2)], indirect=True)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_briefly_unwell_provider_is_waited_out(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    assert fake.config.poll_errors == 0
    assert fake.stats.batches_created == 1
    if provider == "anthropic":
        assert fake.config.results_url_lag == 0  # ended without results_url: polled again


def test_result_files_with_long_lines_are_read_whole(fake: BatchFakeServer) -> None:
    import anyio

    long_line = json.dumps({"custom_id": "k1", "text": "x" * 300_000}).encode()
    fake._files["file-long"] = long_line + b"\n" + b'{"custom_id":"k2"}\n' + b'{"custom_id":"k3"}'

    async def read() -> list[bytes]:
        http, transport = batch_http()
        try:
            return [x async for x in http.lines(f"{fake.url}/files/file-long/content")]
        finally:
            await transport.aclose()

    got = anyio.run(read)
    assert [json.loads(x)["custom_id"] for x in got] == ["k1", "k2", "k3"]
    assert got[0] == long_line


def test_the_fake_is_as_strict_as_the_provider(fake: BatchFakeServer, tmp_path: Path) -> None:
    """Duplicate custom ids fail the batch at validation; a window other than 24h and a file
    without purpose=batch are refused."""
    import anyio

    from ctxprec.connectors.judges.batch.api import create_batch_client
    from ctxprec.storage.core.errors import JudgeFatalError
    from ctxprec.storage.core.settings import JudgeSettings

    body = {"model": "judge-1", "messages": [{"role": "user", "content": "hi"}]}
    client = create_batch_client(JudgeSettings(model="openai/judge-1"))
    path = tmp_path / "dup.jsonl"
    path.write_bytes(client.line("k1", body) * 2)

    async def run() -> str | None:
        try:
            created = await client.submit("c1", path, 2, lambda _: None)
            for _ in range(200):
                remote = await client.poll(created.id)
                if remote.ended:
                    assert not remote.error_retryable
                    return remote.error
                await anyio.sleep(0.01)
            return None
        finally:
            await client.aclose()

    error = anyio.run(run)
    assert error is not None
    assert error.startswith("duplicate_custom_id")
    request = urllib.request.Request(
        f"{fake.url}/batches",
        data=json.dumps(
            {"input_file_id": "x", "endpoint": "/v1/chat/completions", "completion_window": "1h"}
        ).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 400
    assert fake.stats.rejected["completion_window"] == 1
    with pytest.raises(JudgeFatalError):
        anyio.run(_upload_without_purpose, fake.url)


def batch_http() -> tuple[BatchHttp, AiohttpTransport]:
    """The batch endpoints' HTTP over a real transport, with the default judge retry policy
    and instant retry waits."""
    transport = AiohttpTransport(30.0, per_read=True)
    policy = RetryPolicy.of(JudgeSettings())
    return BatchHttp({}, "test", transport, policy, RetryClock(instant=True)), transport


async def _upload_without_purpose(url: str) -> None:
    http, transport = batch_http()
    try:

        def form() -> tuple[bytes, str]:
            upload = ("x.jsonl", b'{"custom_id":"a"}\n', "application/octet-stream")
            return multipart_form({}, {"file": upload})

        await http.json("POST", f"{url}/files", content=form)
    finally:
        await transport.aclose()


def test_python_entry_point_honours_batch_api(
    rows: Path, tmp_path: Path, fake: BatchFakeServer
) -> None:
    from ctxprec import score as score_api
    from ctxprec.config import load_config

    flags = {"judge.model": "openai/judge-1", "judge.batch_api": True, "columns.query": "question",
             "columns.expected": "ground_truth"}  # fmt: skip
    result = score_api(rows, tmp_path / "out", load_config(None, flags), progress="off")
    assert result.exit_code == 0
    assert fake.stats.batches_created == 1
    assert fake.online_calls == 0
    check_rows(tmp_path / "out", rows)


@pytest.mark.parametrize("fake", [BatchFakeConfig(content_404=1)], indirect=True)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_results_that_cannot_be_downloaded_are_asked_again(
    rows: Path, tmp_path: Path, fake: BatchFakeServer, provider: str
) -> None:
    out = tmp_path / "out"
    assert score(rows, out, provider) == 0
    check_rows(out, rows)
    assert fake.stats.batches_created == 2
    assert fake.online_calls == 0
