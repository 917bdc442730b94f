"""The engine is chosen in one place (`ctxprec.engines.choice.choose`) for the CLI and the
Python API: each runnable combination gets its runner, each that cannot run is refused with the
flag to drop or add, before any input is read."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from ctxprec import score
from ctxprec.batchapi.run import score_batch
from ctxprec.config import Config
from ctxprec.engines.choice import Engine, choose
from ctxprec.engines.dask import score_dask
from ctxprec.engines.local import score_local
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.options import BatchOptions
from tests.fakes.inputs import SAMPLE


def _cfg(*, batch_api: bool = False, recheck: float = 0.0, model: str = "offline") -> Config:
    cfg = Config()
    judge = dataclasses.replace(cfg.judge, batch_api=batch_api, model=model)
    return dataclasses.replace(cfg, judge=judge, run=dataclasses.replace(cfg.run, recheck=recheck))


def test_each_engine_gets_its_runner() -> None:
    assert choose(_cfg()) is score_local
    dask = choose(_cfg(), Engine("dask", scheduler="tcp://127.0.0.1:8786"))
    assert isinstance(dask, functools.partial)
    assert dask.func is score_dask
    assert dask.keywords == {"scheduler": "tcp://127.0.0.1:8786", "workers": None}
    how = BatchOptions(wait_s=0.0)
    batch = choose(_cfg(batch_api=True, model="openai/gpt-4o-mini"), Engine(batch=how))
    assert isinstance(batch, functools.partial)
    assert batch.func is score_batch
    assert batch.keywords == {"batch": how}


@pytest.mark.parametrize(
    ("cfg", "engine", "says"),
    [
        (_cfg(), Engine(workers=2), "--scheduler and --workers are for --engine dask"),
        (_cfg(), Engine(batch=BatchOptions()), "--batch-wait and --batch-fallback are for"),
        (
            _cfg(batch_api=True, model="openai/gpt-4o-mini"),
            Engine("dask"),
            "--batch-api runs on the local engine; drop --engine dask",
        ),
        (_cfg(recheck=0.1), Engine("dask"), "--recheck runs on the local engine"),
        (_cfg(batch_api=True, model="offline"), Engine(), "batch"),
    ],
)
def test_what_cannot_run_is_refused_with_the_flag_to_change(
    cfg: Config, engine: Engine, says: str
) -> None:
    with pytest.raises(UserError, match=says):
        choose(cfg, engine)


def test_the_python_api_goes_through_the_same_choice(tmp_path: Path) -> None:
    """`pipeline.score` refuses what the CLI refuses: a batch-API config on a provider without
    a batch API is an error before any output is written."""
    with pytest.raises(UserError):
        score(SAMPLE, tmp_path / "out", _cfg(batch_api=True, model="offline"))
    assert not (tmp_path / "out").exists()
    cfg = _cfg()  # a Config built in code names no memo folder: give it this test's own
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, cache_dir=tmp_path / "memo"))
    result = score(SAMPLE, tmp_path / "ok", cfg, progress="off")
    assert result.summary["rows"]["total"] == 12
