"""ctxprec lives beside other code: the built wheel installed in a fresh venv together with the
PyPI projects named `pipeline`, `connectors` and `storage`, and an application with its own
`storage/` and `pipeline/` packages in its working folder, which imports its own modules and
ctxprec and scores rows with the scorer, `run_evals`, the batch API and `score_frame`.

The venv: `CTXPREC_NEIGHBOURS_VENV` (.ci/run makes it from the wheel it builds: pip reaches the
registries there, a test reaches nothing beyond loopback). Without it the test skips; under
CI=true it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ctxprec.storage.core.metric import map_score

APP = """
import asyncio
import json
import sys

import polars as pl

import connectors  # the PyPI project of that name, installed beside ctxprec
import pipeline.steps  # the application's own packages, first on the path
import storage.models

import ctxprec
from ctxprec.config import load_config

CONTEXT = [
    "Canberra was chosen as the capital of Australia in 1908.",
    "Sydney is the largest city in Australia.",
    "Australia's capital, Canberra, is home to Parliament House.",
]
QUESTION = "What is the capital of Australia?"
ANSWER = "Canberra is the capital of Australia."


async def evals():
    scorer = ctxprec.create_context_precision_scorer("offline", {"context": CONTEXT})
    one = await scorer.run(input=QUESTION, output=ANSWER)
    result = await ctxprec.run_evals(
        data=[{"input": QUESTION, "groundTruth": ANSWER}],
        scorers=[scorer],
        target=lambda q: {"output": ANSWER, "context": CONTEXT[::-1]},
    )
    return one.score, result.scores["context-precision"]


rows = pl.DataFrame({"id": ["a", "b"], "question": [QUESTION] * 2,
                     "expected_output": [ANSWER] * 2, "contexts": [CONTEXT, CONTEXT[:1]]})
rows.write_parquet("rows.parquet")
cfg = load_config(flags={"map": {"query": "question"}, "run.cache_dir": "memo"}, env={})
batch = ctxprec.score("rows.parquet", "out", cfg, progress="off")
frame, summary = ctxprec.score_frame(rows, map={"query": "question"},
                                     options={"cache_dir": "memo"}, progress=False)
scorer_score, evals_score = asyncio.run(evals())
print(json.dumps({
    "own": [storage.models.KIND, pipeline.steps.KIND],
    "connectors": connectors.__file__,
    "ctxprec": ctxprec.__file__,
    "scorer": scorer_score,
    "run_evals": evals_score,
    "batch": [batch.rows, batch.failed, batch.summary["score"]["mean"]],
    "frame": frame.get_column("score").to_list(),
    "frame_mean": summary.mean,
}))
"""


def _fail_or_skip(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def venv() -> Path:
    given = os.environ.get("CTXPREC_NEIGHBOURS_VENV")
    if not given or not (Path(given) / "bin" / "python").exists():
        _fail_or_skip(
            "CTXPREC_NEIGHBOURS_VENV names no venv with the wheel and the PyPI projects "
            "pipeline, connectors and storage (.ci/run makes it)"
        )
    return Path(str(given))


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CTXPREC_CACHE_DIR")}
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _site(venv: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run(venv, Path("/"), "python", "-c", code).stdout.strip())


def test_the_wheel_adds_one_name_beside_the_pypi_namesakes(venv: Path) -> None:
    site = _site(venv)
    for name in ("pipeline", "connectors", "storage"):  # the PyPI projects, really installed
        shown = _run(venv, site, "python", "-m", "pip", "show", name)
        assert shown.returncode == 0, f"the PyPI project {name!r} is not installed"
        assert (site / name).exists()
    records = list(site.glob("ctxprec-*.dist-info/RECORD"))
    assert len(records) == 1, "ctxprec is not installed from the wheel"
    top = {
        line.split(",")[0].split("/")[0]
        for line in records[0].read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("../")
    }
    assert top == {"ctxprec", records[0].parent.name}


def test_an_application_with_its_own_storage_and_pipeline_scores_rows(
    venv: Path, tmp_path: Path
) -> None:
    for package, module in (("storage", "models"), ("pipeline", "steps")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
        (tmp_path / package / f"{module}.py").write_text(
            f'KIND = "the app\'s own {package}"\n', encoding="utf-8"
        )
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    done = _run(venv, tmp_path, "python", "app.py")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["own"] == ["the app's own storage", "the app's own pipeline"]
    site = str(_site(venv))
    assert got["connectors"].startswith(site)
    assert got["ctxprec"].startswith(site)
    # the offline judge: relevant, not relevant, relevant (and reversed: relevant first)
    assert got["scorer"] == map_score([True, False, True])
    assert got["run_evals"] == map_score([True, False, True][::-1])
    assert got["batch"][:2] == [2, 0]
    assert got["frame"] == [got["scorer"], 1.0]
    assert got["frame_mean"] == got["batch"][2]
    for command in (["ctxprec", "--version"], ["python", "-m", "ctxprec", "--version"]):
        version = _run(venv, tmp_path, *command)
        assert version.returncode == 0, version.stderr
        assert version.stdout.startswith("ctxprec ")
