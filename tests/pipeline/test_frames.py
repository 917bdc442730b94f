"""`ctxprec.score_frame`: DataFrames in and out. Labelled rows scored from pandas, Polars (eager
and lazy), Arrow and a list of dicts, inside a running event loop and out of one: every score is
the MAP of the labels (the fake judge's verdicts are the labels) and the CLI's score of the same
row; the summary, the verdict, the memo, errors in the API's words, progress, and pandas left
unimported when not given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import polars as pl
import pyarrow as pa
import pytest

import ctxprec
from ctxprec import ConfigError, InputError, map_score
from ctxprec.cli.main import main
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.outdir.ownership import part_files
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeServer, expected_verdict


def _rows(fake: FakeJudgeServer, n: int = 9) -> pl.DataFrame:
    """Rows with 2-5 passages each, `relevance` the verdicts the fake judge gives them (so the
    labels' MAP is each row's expected score), and an empty context."""
    contexts = [[f"passage {i}.{j}" for j in range(2 + i % 4)] for i in range(n)]
    contexts[3] = []
    return pl.DataFrame(
        {
            "question": [f"question {i}?" for i in range(n)],
            "answer": [f"answer {i}." for i in range(n)],
            "docs": contexts,
            "relevance": [[expected_verdict(c, fake.config) for c in ctx] for ctx in contexts],
            "team": [f"t{i % 2}" for i in range(n)],
        }
    )


MAP = {"query": "question", "expected": "answer", "context": "docs", "labels": "relevance"}


def _options(tmp_path: Path) -> dict[str, Any]:
    return {"cache_dir": tmp_path / "memo"}


def _as(kind: str, frame: pl.DataFrame) -> Any:
    return {
        "pandas": frame.to_pandas,
        "polars": lambda: frame,
        "lazy": frame.lazy,
        "arrow": frame.to_arrow,
        "rows": frame.to_dicts,
    }[kind]()


def _column(out: Any, kind: str, name: str) -> list[Any]:
    if kind == "pandas":  # list cells come as numpy arrays, numbers as numpy scalars
        return [v.tolist() if hasattr(v, "tolist") else v for v in out[name]]
    if kind == "lazy":
        return out.collect().get_column(name).to_list()
    if kind == "polars":
        return out.get_column(name).to_list()
    if kind == "arrow":
        return out.column(name).to_pylist()
    return [row[name] for row in out]


KINDS = ["pandas", "polars", "lazy", "arrow", "rows"]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_in_a_running_loop_gives_label_map_and_the_clis_scores(
    kind: str, fake: FakeJudgeServer, tmp_path: Path
) -> None:
    rows = _rows(fake)
    # the plain call, inside this test's running event loop (as in a Jupyter cell)
    out, summary = ctxprec.score_frame(
        _as(kind, rows), model="openai/x", columns=MAP, options=_options(tmp_path), progress=False
    )
    assert type(out) is type(_as(kind, rows))
    names = {
        "rows": lambda: list(out[0]),
        "arrow": lambda: out.column_names,
        "lazy": lambda: out.collect_schema().names(),
    }.get(kind, lambda: list(out.columns))()
    assert names[: rows.width] == rows.columns
    assert names[rows.width : rows.width + 2] == ["score", "status"]  # no column of ctxprec's own
    assert _column(out, kind, "question") == rows.get_column("question").to_list()
    labels_map = [map_score(labels) for labels in rows.get_column("relevance").to_list()]
    assert _column(out, kind, "score") == labels_map
    assert _column(out, kind, "label_score") == labels_map
    assert _column(out, kind, "status")[3] == "empty_context"
    # the CLI on the same rows, written to Parquet with ids
    source = tmp_path / "rows.parquet"
    rows.with_row_index("id").write_parquet(source)
    flags = [f"{k}={v}" for k, v in MAP.items()]
    argv = ["score", str(source), "-o", str(tmp_path / "cli"), "--model", "openai/x",
            "--cache-dir", str(tmp_path / "cli-memo"), "--progress", "off"]  # fmt: skip
    assert await anyio.to_thread.run_sync(main, [*argv, "--map", ",".join(flags)]) == 0
    cli = pl.read_parquet(part_files(tmp_path / "cli")).sort("id")
    assert cli.get_column("score").to_list() == labels_map
    assert _column(out, kind, "verdicts") == [list(v) for v in cli.get_column("verdicts")]
    assert summary.rows == rows.height
    assert summary.statuses == {"ok": 8, "empty_context": 1, "failed": 0}
    assert summary.mean == round_figure(sum(labels_map) / len(labels_map))
    assert summary.estimate is not None  # labels given: the corrected estimate
    assert summary.verdict.passed


async def test_the_awaitable_form_and_a_memo_shared_with_the_cli(
    fake: FakeJudgeServer, tmp_path: Path
) -> None:
    rows = _rows(fake)
    first = await ctxprec.score_frame_async(
        rows, model="openai/x", map=MAP, options=_options(tmp_path), progress=False
    )
    calls = fake.stats.total
    assert first.summary.judge_calls == calls > 0
    again = await ctxprec.score_frame_async(
        rows, model="openai/x", map=MAP, options=_options(tmp_path), progress=False
    )
    assert fake.stats.total == calls  # every verdict from the memo
    assert (again.summary.judge_calls, again.summary.memo_hits) == (0, calls)
    assert again.frame.get_column("score").to_list() == first.frame.get_column("score").to_list()


def test_a_script_thresholds_failed_rows_and_the_verdict(
    fake: FakeJudgeServer, tmp_path: Path
) -> None:
    rows = _rows(fake).with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("question"))
        .alias("question")
    )  # fmt: skip
    out, summary = ctxprec.score_frame(
        rows, model="openai/x", columns=MAP, options=_options(tmp_path), thresholds=1.0,
        progress=False,
    )  # fmt: skip
    assert out.get_column("status")[5] == "failed"
    verdict = summary.verdict
    assert verdict.status == "failed"
    assert verdict.outcomes == {"completed": 8, "skipped": 0, "error": 1}
    assert verdict.reasons[0].startswith("context-precision: the mean score of 8 scored rows is")
    assert verdict.reasons[1] == "1 of 9 rows failed to run: row 5: invalid_input: query is null"


def test_rows_marked_not_scorable_are_held_out_and_counted_apart(tmp_path: Path) -> None:
    """columns={"not_scorable": COL}: True or a reason marks a row with nothing to judge (small
    talk, a turn that retrieved nothing on purpose): it never reaches the judge, comes back in
    its place as `not_scorable` with no score, and is left out of the mean and the thresholds,
    counted as skipped, as run_evals counts ctxprec.not_scorable()."""
    frame = pl.DataFrame(
        {
            "question": ["What is the capital of France?", "hi!", "Who wrote Hamlet?", "thanks"],
            "answer": ["Paris is the capital of France.", None, "Shakespeare wrote Hamlet.", None],
            "docs": [["Paris is the capital of France.", "Lyon is big."], [],
                     ["Hamlet is a play by Shakespeare."], []],
            "skip": [None, "small talk", "", "thanks only"],
        }
    )  # fmt: skip
    cols = {"query": "question", "expected": "answer", "context": "docs", "not_scorable": "skip"}
    options = {"cache_dir": tmp_path / "memo"}
    out, summary = ctxprec.score_frame(
        frame, model="offline", columns=cols, options=options, thresholds=0.9, progress=False
    )
    assert out.get_column("status").to_list() == ["ok", "not_scorable", "ok", "not_scorable"]
    assert out.get_column("score").to_list() == [1.0, None, 1.0, None]
    assert out.get_column("reason")[1] == "not scorable: small talk"
    assert out.get_column("skip").to_list() == frame.get_column("skip").to_list()
    assert summary.rows == 4
    assert summary.statuses["not_scorable"] == 2
    assert summary.mean == 1.0  # the two scored rows only
    assert summary.judge_calls == 3  # the held rows' items were never judged
    assert summary.verdict.status == "passed"
    assert summary.verdict.outcomes == {"completed": 2, "skipped": 2, "error": 0}
    # the same in pandas, with the map as text and True as the mark
    flags = frame.with_columns(pl.Series("skip", [False, True, None, True]))
    back, again = ctxprec.score_frame(
        flags.to_pandas(), model="offline", map="query=question, expected=answer, context=docs, "
        "not_scorable=skip", options=options, progress=False,
    )  # fmt: skip
    assert list(back["status"]) == ["ok", "not_scorable", "ok", "not_scorable"]
    assert back["reason"][1] == "not scorable"
    assert again.judge_calls == 0  # the memo had them
    with pytest.raises(ConfigError, match="holds 3 in row 0"):
        ctxprec.score_frame(
            frame.with_columns(pl.lit(3).alias("skip")), model="offline", columns=cols,
            progress=False,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="no such column"):
        ctxprec.score_frame(frame, model="offline", columns={**cols, "not_scorable": "nope"})


def test_errors_speak_of_the_frame_and_its_column_map(tmp_path: Path) -> None:
    frame = pl.DataFrame({"question": ["q?"], "docs": [["a", "b"]]})
    with pytest.raises(InputError) as caught:
        ctxprec.score_frame(frame, columns={"context": "docs"}, options=_options(tmp_path))
    message = str(caught.value)
    assert "column `query` is missing in the frame" in message
    assert "columns={'query': COLUMN}" in message
    assert "ctxprec-frame-" not in message
    with pytest.raises(ConfigError, match=r"already has column.*score"):
        ctxprec.score_frame(frame.with_columns(score=pl.lit(1.0)), map={"query": "question"})
    with pytest.raises(ConfigError, match="unknown option 'sink'"):
        ctxprec.score_frame(frame, options={"sink": "delta:x"})
    with pytest.raises(TypeError, match="list of dicts"):
        ctxprec.score_frame("rows.parquet")


def test_progress_is_tqdm_autos_bar_unless_turned_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = pl.DataFrame({"query": ["q?", "r?"], "contexts": [["a"], ["b", "c"]]})
    ctxprec.score_frame(frame, options=_options(tmp_path))
    assert "2/2" in capsys.readouterr().err
    ctxprec.score_frame(frame, options=_options(tmp_path), progress=False)
    assert capsys.readouterr().err == ""


def test_pandas_is_imported_only_for_a_pandas_frame(tmp_path: Path) -> None:
    code = (
        "import sys, polars as pl, ctxprec\n"
        "frame = pl.DataFrame({'query': ['q?'], 'contexts': [['a', 'b']]})\n"
        f"ctxprec.score_frame(frame, options={{'cache_dir': {str(tmp_path)!r}}}, progress=False)\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_an_arrow_record_batch_comes_back_as_a_table(tmp_path: Path) -> None:
    batch = pa.record_batch({"query": ["q?"], "contexts": [["a", "b"]]})
    out = ctxprec.score_frame(batch, options=_options(tmp_path), progress=False).frame
    assert out.column("status").to_pylist() == ["ok"]
