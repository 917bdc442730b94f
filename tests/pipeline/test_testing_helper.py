"""`ctxprec.testing.assert_evals` in a user's own pytest file: a passing and a failing verdict of
`run_evals` and of `score_frame`, the failure a readable message naming the threshold, the mean
and the outcomes, with no frame of ctxprec's in the traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ctxprec import create_context_precision_scorer, run_evals
from ctxprec.testing import EvalsFailed, assert_evals

USER_TESTS = """
import asyncio

import polars as pl

import ctxprec
from ctxprec.testing import assert_evals

CONTEXT = [
    "Canberra was chosen as the capital of Australia in 1908.",
    "Sydney is the largest city in Australia.",
    "Australia's capital, Canberra, is home to Parliament House.",
]
DATA = [{"input": "What is the capital of Australia?", "groundTruth": "Canberra"}] * 3


def evals(threshold):
    scorer = ctxprec.create_context_precision_scorer("offline", {"context": CONTEXT})
    return asyncio.run(
        ctxprec.run_evals(data=DATA, scorers=[{"scorer": scorer, "threshold": threshold}])
    )


def test_retrieval_is_good_enough():
    assert_evals(evals(0.8))


def test_retrieval_is_excellent():
    assert_evals(evals(0.9))


def test_the_nightly_frame():
    frame = pl.DataFrame({"query": ["What is the capital of Australia?"] * 2,
                          "expected_output": ["Canberra"] * 2, "contexts": [CONTEXT] * 2})
    scored = ctxprec.score_frame(frame, options={"cache_dir": "memo"}, progress=False)
    assert_evals(scored, thresholds=0.5)
"""


def test_a_users_pytest_file_fails_with_the_verdict_in_words(tmp_path: Path) -> None:
    (tmp_path / "test_user_evals.py").write_text(USER_TESTS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user_evals.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 2 passed" in out
    assert "FAILED test_user_evals.py::test_retrieval_is_excellent" in out
    assert (
        "context-precision: the mean score of 3 scored items is 0.8300, 0.0700 below the "
        "threshold 0.9" in out
    )
    assert "verdict: failed (3 completed, 0 skipped, 0 error)" in out
    assert "ctxprec/testing.py" not in out
    assert "pipeline/testing.py" not in out


async def test_thresholds_given_to_the_helper_and_its_refusals() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ["Canberra."]})
    evals = await run_evals(
        data=[{"input": "Capital?", "groundTruth": "Canberra"}], scorers=[scorer]
    )
    assert assert_evals(evals).passed  # no threshold, nothing failed
    with pytest.raises(EvalsFailed) as caught:
        assert_evals(evals, thresholds={"context-precision": 1.5})
    assert caught.value.verdict.status == "failed"
    with pytest.raises(TypeError, match="what run_evals or score_frame returns"):
        assert_evals({"verdict": "passed"})
