"""What was paid against what the verdicts cost: two nights of the same rows with a priced
real-provider model string, against a fake provider that counts what it is paid. Night 2 takes
every verdict from the memo and pays nothing; every figure that says "paid" (CLI lines,
`--quiet` JSON, summary.json/md/html, run.json, the Parquet columns, the DuckDB and Delta
sinks, the nights table, compare, the Python API) matches the fake's own counts, and the
verdicts' figures say what the rows' verdicts cost when first paid. Outputs of schema 1 (one
token pair) stay readable; a table made from them is refused with the way out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ctxprec.cli.main import main
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread

MODEL = "openai/gpt-4o-mini"  # priced by the provider registry
NIGHTS = ("2026-12-01", "2026-12-02")


def _night_rows(root: Path, night: str) -> Path:
    """The same 10 questions and passages every night, under the night's own ids."""
    folder = root / "logs" / f"dt={night}"
    folder.mkdir(parents=True)
    pl.DataFrame(
        {
            "id": [f"{night}/q{i}" for i in range(10)],
            "query": [f"Who wrote book {i}?" for i in range(10)],
            "expected_output": [f"Author {i} wrote book {i}." for i in range(10)],
            "contexts": [
                [f"Book {i} is by Author {i}.", f"Shelf {i % 3}.", "Rain."] for i in range(10)
            ],
            "query_id": [f"q{i}" for i in range(10)],  # the same query every night
        }
    ).write_parquet(folder / "part-0.parquet")
    return folder


def _usd(price: dict[str, float], t_in: int, t_out: int) -> float:
    return round((t_in * price["input_per_mtok"] + t_out * price["output_per_mtok"]) / 1e6, 4)


@pytest.fixture
def paid_fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


def _paid_so_far(server: FakeJudgeServer) -> tuple[int, int]:
    return server.stats.input_tokens, server.stats.output_tokens


def test_two_nights_of_the_same_rows_pay_once(
    tmp_path: Path, paid_fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    out, lake, wh = tmp_path / "scores", tmp_path / "lake", tmp_path / "wh.duckdb"
    sinks = ["--sink", f"delta:{lake}", "--sink", f"duckdb:{wh}:scores"]
    paid, lines = [], []
    for night in NIGHTS:
        before = _paid_so_far(paid_fake)
        args = [str(_night_rows(tmp_path, night)), "-o", str(out), "--incremental", "--model",
                MODEL, "--partition-by", "dt", "--passthrough", "query_id", *sinks,
                "--progress", "off"]  # fmt: skip
        assert main(["score", *args]) == 0
        after = _paid_so_far(paid_fake)
        paid.append((after[0] - before[0], after[1] - before[1]))
        lines.append(capsys.readouterr().out)
    (n1_in, n1_out), (n2_in, n2_out) = paid
    assert n1_in > 0
    assert (n2_in, n2_out) == (0, 0)  # night 2: every verdict from the memo
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    price = run["price"]
    n1_usd = _usd(price, n1_in, n1_out)
    assert n1_usd > 0

    # the Parquet columns: per night, paid is what the fake was paid; the verdicts' cost twice
    rows = pl.concat([pl.read_parquet(p) for p in part_files(out)], how="vertical_relaxed")
    night = pl.col("id").str.starts_with
    first, second = rows.filter(night(NIGHTS[0])), rows.filter(night(NIGHTS[1]))
    assert (first["paid_input_tokens"].sum(), first["paid_output_tokens"].sum()) == (n1_in, n1_out)
    assert (second["paid_input_tokens"].sum(), second["paid_output_tokens"].sum()) == (0, 0)
    for rows_of_night in (first, second):
        assert rows_of_night["verdict_input_tokens"].sum() == n1_in
        assert rows_of_night["verdict_output_tokens"].sum() == n1_out

    # summary.json: paid this run, paid by all runs, the verdicts of all rows
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == {
        "paid_input_this_run": 0,
        "paid_output_this_run": 0,
        "paid_input_all_runs": n1_in,
        "paid_output_all_runs": n1_out,
        "verdict_input_all_rows": 2 * n1_in,
        "verdict_output_all_rows": 2 * n1_out,
    }
    assert summary["cost_usd"] == {
        "paid_this_run": 0.0,
        "paid_all_runs": n1_usd,
        "verdicts_all_rows": _usd(price, 2 * n1_in, 2 * n1_out),
    }
    assert [r["paid_input_tokens"] for r in summary["history"]["runs"]] == [n1_in, 0]
    nights = summary["trend"]["nights"]
    assert [n["paid_input_tokens"] for n in nights] == [n1_in, 0]
    assert [n["verdict_input_tokens"] for n in nights] == [n1_in, n1_in]
    assert [n["paid_cost_usd"] for n in nights] == [n1_usd, 0.0]

    # run.json: this run paid nothing; the verdicts of the rows it wrote cost night 1's
    assert run["tokens"] == {
        "paid_input_tokens": 0,
        "paid_output_tokens": 0,
        "verdict_input_tokens": n1_in,
        "verdict_output_tokens": n1_out,
    }
    assert run["cost_usd"]["paid"] == 0.0
    assert round(run["cost_usd"]["verdicts"], 4) == n1_usd

    # the CLI lines and summary.md say which figure is which
    assert f"paid {n1_usd:g} USD ({n1_in:,} / {n1_out:,} tokens)" in lines[0]
    assert "34 memo hits" not in lines[1]
    assert ", paid 0 USD" in lines[1]
    assert "all runs: 2 runs, 20 rows scored" in lines[1]
    assert f"paid {n1_usd:g} USD" in lines[1].split("all runs:")[1]
    said = f"verdicts of the 20 rows: {_usd(price, 2 * n1_in, 2 * n1_out):g} USD, "
    assert said + f"{2 * n1_in:,} / {2 * n1_out:,} tokens when first paid" in lines[1]
    md = (out / "summary.md").read_text()
    assert "| paid by this run: tokens in / out | 0 / 0 |" in md
    assert f"| paid by all runs of the output: tokens in / out | {n1_in:,} / {n1_out:,} |" in md
    assert f"| the rows' verdicts when first paid: tokens in / out | {2 * n1_in:,} /" in md
    html = (out / "summary.html").read_text()
    assert "cost USD paid" in html
    assert "this run paid 0" in html

    # the sinks hold both figures, as the parts do
    con = duckdb.connect(str(wh), read_only=True)
    got = con.execute(
        "SELECT dt, sum(paid_input_tokens), sum(verdict_input_tokens) FROM scores "
        "GROUP BY dt ORDER BY dt"
    ).fetchall()
    con.close()
    assert got == [(NIGHTS[0], n1_in, n1_in), (NIGHTS[1], 0, n1_in)]
    delta = pl.from_arrow(DeltaTable(str(lake)).to_pyarrow_table())
    assert isinstance(delta, pl.DataFrame)
    assert delta["paid_input_tokens"].sum() == n1_in
    assert delta["verdict_input_tokens"].sum() == 2 * n1_in

    # --quiet: a retry of night 2 (nothing new) still tells both figures apart
    args = [str(tmp_path / "logs" / f"dt={NIGHTS[1]}"), "-o", str(out), "--incremental",
            "--model", MODEL, "--partition-by", "dt", "--passthrough", "query_id",
            "--quiet"]  # fmt: skip
    assert main(["score", *args]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["paid"] == {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    assert line["verdicts_all_rows"]["input_tokens"] == 2 * n1_in
    assert line["all_runs"]["paid_input_tokens"] == n1_in
    assert line["all_runs"]["paid_cost_usd"] == n1_usd

    # compare the two nights: what each side's rows paid, and their verdicts' cost
    sides = ["compare", str(out), "--a", f"dt={NIGHTS[0]}", "--b", f"dt={NIGHTS[1]}", "--json"]
    assert main([*sides, "--on", "query_id"]) == 0
    cost = json.loads(capsys.readouterr().out)["judge_agreement"]["cost"]
    assert (cost["a"]["paid_input_tokens"], cost["b"]["paid_input_tokens"]) == (n1_in, 0)
    assert cost["a"]["verdict_input_tokens"] == cost["b"]["verdict_input_tokens"] == n1_in


def test_the_python_api_keeps_the_two_figures(tmp_path: Path, paid_fake: FakeJudgeServer) -> None:
    import asyncio

    from ctxprec import Config, RunOptions, create_context_precision_scorer, score
    from ctxprec.config import load_config

    cfg: Config = load_config(None, {"judge.model": MODEL})
    src = _night_rows(tmp_path, NIGHTS[0])
    first = score(str(src), str(tmp_path / "a"), cfg, RunOptions(progress="off"))
    spent = _paid_so_far(paid_fake)
    assert (first.paid_input_tokens, first.paid_output_tokens) == spent
    assert (first.verdict_input_tokens, first.verdict_output_tokens) == spent
    again = score(str(src), str(tmp_path / "b"), cfg, RunOptions(progress="off"))
    assert _paid_so_far(paid_fake) == spent  # nothing paid the second time
    assert (again.paid_input_tokens, again.paid_cost_usd) == (0, 0.0)
    assert again.verdict_input_tokens == spent[0]
    assert again.verdict_cost_usd == pytest.approx(first.paid_cost_usd)

    memo = {"context": ["Book 1 is by Author 1.", "Rain."], "cache_dir": str(tmp_path / "m")}
    scorer = create_context_precision_scorer(MODEL, memo)

    async def twice() -> tuple[Any, Any]:
        one = await scorer.run(input="Who wrote book 1?", output="Author 1 wrote book 1.")
        two = await scorer.run(input="Who wrote book 1?", output="Author 1 wrote book 1.")
        await scorer.aclose()
        return one, two

    one, two = asyncio.run(twice())
    assert one.paid_input_tokens == one.verdict_input_tokens > 0
    assert (two.paid_input_tokens, two.paid_output_tokens) == (0, 0)  # from the memo
    assert two.verdict_input_tokens == one.verdict_input_tokens


def test_the_offline_judge_costs_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The offline judge calls no provider: its cost is 0, not unknown."""
    src = _night_rows(tmp_path, NIGHTS[0])
    out = tmp_path / "out"
    assert main(["score", str(src), "-o", str(out), "--progress", "off"]) == 0
    assert ", paid 0 USD" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cost_usd"] == {"paid_this_run": 0.0, "paid_all_runs": 0.0,
                                   "verdicts_all_rows": 0.0}  # fmt: skip
    assert "| paid by this run: cost USD | 0 |" in (out / "summary.md").read_text()
    assert main(["score", str(src), "-o", str(tmp_path / "audited"), "--progress", "off",
                 "--audit-model", "offline/strict", "--audit-fraction", "1"]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "cost unknown" not in said
    assert "offline/strict: " in said
    assert "$0.0000" in said


def _as_schema_one(out: Path) -> None:
    """Rewrite an output's parts as output schema 1 wrote them: one token pair (the verdicts'),
    and their commit records without the checks kept of each file since."""
    for path in part_files(out):
        table = pq.read_table(path)
        names = [
            {"verdict_input_tokens": "input_tokens", "verdict_output_tokens": "output_tokens"}.get(
                n, n
            )
            for n in table.column_names
        ]
        table = table.rename_columns(names).drop(["paid_input_tokens", "paid_output_tokens"])
        meta = {b"ctxprec.schema_version": b"1"}
        pq.write_table(table.replace_schema_metadata(meta), path)
    for record in (out / "_ctxprec" / "parts").glob("*.json"):  # as schema 1's runs wrote them
        kept = json.loads(record.read_text())
        kept.pop("checks", None)
        record.write_text(json.dumps(kept))


def test_outputs_of_schema_one_stay_readable(
    tmp_path: Path, paid_fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _night_rows(tmp_path, NIGHTS[0])
    old, new = tmp_path / "old", tmp_path / "new"
    for out in (old, new):
        assert main(["score", str(src), "-o", str(out), "--model", MODEL, "--quiet"]) == 0
    verdicts = pl.read_parquet(old / "*.parquet")["verdict_input_tokens"].sum()
    _as_schema_one(old)
    capsys.readouterr()
    assert main(["summary", str(old)]) == 0
    printed = capsys.readouterr().out
    assert "verdicts of the 10 rows: " in printed
    summary = json.loads((old / "summary.json").read_text())
    assert summary["tokens"]["verdict_input_all_rows"] == verdicts
    assert main(["compare", str(old), str(new), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cost = report["judge_agreement"]["cost"]
    assert cost["a"]["verdict_input_tokens"] == verdicts
    assert cost["a"]["paid_input_tokens"] is None  # not recorded then: unknown, not 0
    assert cost["b"]["paid_input_tokens"] == 0  # the memo paid for the second output


def test_a_table_made_from_schema_one_is_refused_with_the_way_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wh = tmp_path / "wh.duckdb"
    con = duckdb.connect(str(wh))
    con.execute(
        "CREATE TABLE scores (id VARCHAR NOT NULL, input_tokens BIGINT NOT NULL, "
        "output_tokens BIGINT NOT NULL)"
    )
    con.close()
    src = _night_rows(tmp_path, NIGHTS[0])
    code = main(["score", str(src), "-o", str(tmp_path / "out"), "--sink", f"duckdb:{wh}:scores"])
    assert code == 2
    err = capsys.readouterr().err
    assert "output schema 1" in err
    assert "verdict_input_tokens" in err
    assert "docs/output.md" in err
    assert pa.__name__  # (pyarrow is what the parts were rewritten with above)
