"""[run] log_level and debug (CTXPREC_LOG_LEVEL, CTXPREC_DEBUG): declared once in the settings,
read through the loader from the environment before any config file, and from a config file
once a command loads one."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import ctxprec.cli.main as cli
from ctxprec.cli.main import main
from ctxprec.storage.core.seams import Seams


def _bug(point: str, subject: object) -> None:
    """A command with a bug: `score` loads its config, then fails with no UserError."""
    if point == "config":
        raise RuntimeError("a bug")


def buggy(argv: list[str]) -> int:
    """`ctxprec ARGV` whose score command fails as a bug would, once its config is loaded."""
    return main(argv, seams=Seams(fault=_bug))


@pytest.fixture
def buggy_score(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CTXPREC_DEBUG", raising=False)
    monkeypatch.delenv("CTXPREC_LOG_LEVEL", raising=False)
    yield
    # the score command stopped before its run, which gives the collector back as it was; the
    # objects the CLI froze as it loaded the command's modules go back to the collector here
    gc.unfreeze()


def _handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger("ctxprec").handlers if isinstance(h, cli._LogHandler)]


@pytest.mark.usefixtures("buggy_score")
def test_an_internal_error_shows_no_traceback_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert buggy(["score", "in.parquet", "-o", "out"]) == 3
    err = capsys.readouterr().err
    assert "ctxprec: internal error: RuntimeError: a bug" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("buggy_score")
def test_ctxprec_debug_from_the_environment_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPREC_DEBUG", "1")
    assert buggy(["score", "in.parquet", "-o", "out"]) == 3
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.usefixtures("buggy_score")
def test_debug_from_a_config_file_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[run]\ndebug = true\nlog_level = "info"\n', encoding="utf-8")
    try:
        assert buggy(["score", "in.parquet", "-o", "out", "--config", str(config)]) == 3
        assert len(_handlers()) == 1
    finally:
        cli._setup_logging(None)
    assert "Traceback" in capsys.readouterr().err
    assert _handlers() == []


@pytest.mark.usefixtures("buggy_score")
def test_a_value_that_is_no_boolean_is_refused_by_the_loader(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPREC_DEBUG", "maybe")
    assert buggy(["score", "in.parquet", "-o", "out"]) == 2
    assert "CTXPREC_DEBUG (environment) must be a boolean" in capsys.readouterr().err


@pytest.mark.usefixtures("buggy_score")
def test_the_log_level_from_the_environment_sets_one_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXPREC_LOG_LEVEL", "debug")
    try:
        buggy(["score", "in.parquet", "-o", "out"])  # set before the command, again by _config
        assert len(_handlers()) == 1
        assert logging.getLogger("ctxprec").level == logging.DEBUG
    finally:
        cli._setup_logging(None)
