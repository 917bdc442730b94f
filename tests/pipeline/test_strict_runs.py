"""`ctxprec score` with nothing but `--model` against strict stand-ins of the real APIs: every row
is the MAP of the server's verdicts with at most 1.25 requests per distinct (query, item); an
account out of quota stops the run with exit code 4 after a few refused requests, keeps what
was finished, and the same command resumes once the account is fixed."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.metric import map_score
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import expected_verdict
from tests.fakes.strict import StrictConfig, StrictThread


def make_input(path: Path, rows: int, per_row: int = 4) -> Path:
    """Rows of `per_row` context items; items repeat across rows (the memo and de-dup work)."""
    pool = [f"Passage {i}: the river {i} flows {i * 3} km to the sea." for i in range(rows * 2)]
    frame = pl.DataFrame(
        {
            "id": [f"r{i:04d}" for i in range(rows)],
            "query": ["How long is the river?"] * rows,
            "expected_output": ["It is long."] * rows,
            "contexts": [
                [pool[(i * 3 + j) % len(pool)] for j in range(per_row)] for i in range(rows)
            ],
        }
    )
    frame.write_parquet(path)
    return path


def score(src: Path, out: Path, model: str, monkeypatch: pytest.MonkeyPatch, url: str,
          *flags: str) -> int:  # fmt: skip
    env = "ANTHROPIC" if model.startswith("anthropic/") else "OPENAI"
    monkeypatch.setenv(f"{env}_BASE_URL", url)
    monkeypatch.setenv(f"{env}_API_KEY", KEY)
    args = ["score", str(src), "-o", str(out), "--model", model, "--progress", "off", *flags]
    return main(args)


@pytest.mark.parametrize(
    "model", ["openai/gpt-5-mini", "openai/o4-mini", "openai/gpt-5.1", "anthropic/claude-opus-4-7"]
)
def test_only_model_given_every_row_is_the_map_of_the_servers_verdicts(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_input(tmp_path / "in.parquet", rows=60)
    with StrictThread(StrictConfig(require_key=KEY)) as server:
        url = server.root if model.startswith("anthropic/") else server.url
        assert score(src, tmp_path / "out", model, monkeypatch, url) == 0
        sent = server.stats.total
        run = json.loads((tmp_path / "out" / "_ctxprec" / "run.json").read_text())
        assert score(src, tmp_path / "out", model, monkeypatch, url) == 0  # re-run: memo
        assert server.stats.total == sent
    df = pl.read_parquet(tmp_path / "out" / "*.parquet").join(pl.read_parquet(src), on="id")
    assert df.height == 60
    assert df.get_column("status").unique().to_list() == ["ok"]
    for row in df.iter_rows(named=True):
        verdicts = [expected_verdict(item) for item in row["contexts"]]
        assert row["verdicts"] == verdicts
        assert row["score"] == map_score(verdicts)
    distinct = len({item for items in df.get_column("contexts") for item in items})
    assert sent <= 1.25 * distinct
    assert server.stats.by_status.keys() == {200}
    assert run["judge"]["output_tokens"] > 0
    assert run["judge"]["adaptations"] == {}


def test_llama_cpp_flavour_steps_down_once_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_input(tmp_path / "in.parquet", rows=30)
    with StrictThread(StrictConfig(flavor="llamacpp")) as server:
        assert score(src, tmp_path / "out", "openai/smollm2", monkeypatch, server.url) == 0
        wasted = server.stats.by_status[500]
    assert 1 <= wasted <= 32
    run = json.loads((tmp_path / "out" / "_ctxprec" / "run.json").read_text())
    assert list(run["judge"]["adaptations"]) == [
        "structured output: json_object_schema (the server rejected json_schema)"
    ]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "json_object_schema" in summary


@pytest.mark.parametrize(
    ("model", "account", "words"),
    [("openai/gpt-5-mini", "quota", "quota"),
     ("anthropic/claude-opus-4-7", "credit_low", "credit")],
)  # fmt: skip
def test_out_of_quota_stops_the_run_with_exit_4_and_the_same_command_resumes(
    model: str, account: str, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    src = make_input(tmp_path / "in.parquet", rows=300)
    out = tmp_path / "out"
    with StrictThread(StrictConfig(account=account)) as server:
        url = server.root if model.startswith("anthropic/") else server.url
        code = score(src, out, model, monkeypatch, url, "--concurrency", "32")
        refused = server.stats.total
        err = capsys.readouterr().err
        assert code == 4, err
        assert refused <= 48  # the calls in flight when the first refusal came back, no more
        assert words in err
        assert "Fix:" in err
        assert "run the same command again" in err
        assert "rows failed" not in err
        assert KEY not in err
        server.config.account = "ok"
        assert score(src, out, model, monkeypatch, url, "--concurrency", "32") == 0
    df = pl.read_parquet(out / "*.parquet")
    assert df.height == 300
    assert df.get_column("status").unique().to_list() == ["ok"]


def test_cached_prompt_tokens_are_priced_at_the_cached_price() -> None:
    from ctxprec.storage.core.settings import Price
    from ctxprec.storage.report.summary import _usd

    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cached_input_per_mtok": 0.5}
    # 1M at 1.0 + 1M cached at 0.5 + 1M x 2
    assert _usd(price, 2_000_000, 1_000_000, 1_000_000) == 3.5
    assert Price(**price).usd(2_000_000, 1_000_000, 1_000_000) == 3.5  # run.json's, the same
    plain = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    assert _usd(plain, 2_000_000, 1_000_000, 1_000_000) == 4.0
