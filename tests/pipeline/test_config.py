"""Configuration precedence (flag > env > file > defaults) and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import DEFAULTS, load_config
from storage.core.errors import ConfigError


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_come_from_one_table() -> None:
    cfg = load_config(None, {}, env={})
    assert cfg.judge.model == DEFAULTS["judge.model"] == "offline"
    assert cfg.limits.concurrency == DEFAULTS["limits.concurrency"]
    assert cfg.column_map.context == "contexts" and cfg.column_map.expected == "expected_output"
    assert cfg.scoring.ks == (1, 3, 5)


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[limits]\nconcurrency = 5\nrpm = 100\n[judge]\nmodel = "openai/x"\n')
    cfg = load_config(path, {}, env={})
    assert (cfg.limits.concurrency, cfg.limits.rpm, cfg.judge.model) == (5, 100.0, "openai/x")
    cfg = load_config(path, {}, env={"CTXPREC_CONCURRENCY": "7"})
    assert cfg.limits.concurrency == 7 and cfg.limits.rpm == 100.0
    cfg = load_config(path, {"limits.concurrency": 9}, env={"CTXPREC_CONCURRENCY": "7"})
    assert cfg.limits.concurrency == 9


def test_prices_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[prices."openai/m"]\ninput_per_mtok = 1.5\noutput_per_mtok = 6\n')
    price = load_config(path, {}, env={}).price_for("openai/m")
    assert price is not None and price.output_per_mtok == 6.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[limits\nconcurrency = 1", "is not valid TOML"),
        ("[limits]\nconcurency = 3", "unknown setting(s) limits.concurency"),
        ('[limits]\nconcurrency = "many"', "[limits] concurrency in"),
        ("[limits]\nconcurrency = 0", "at least 1"),
        ('[judge]\nmode = "batch"', "[judge] mode in"),
        ('[columns]\nextractor = "nocolon"', "module:function"),
        ("[scoring]\nscale = -1", "[scoring] scale in"),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(_toml(tmp_path, text), {}, env={})
    assert message in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", {}, env={})


def test_env_value_of_wrong_type() -> None:
    with pytest.raises(ConfigError, match="environment"):
        load_config(None, {}, env={"CTXPREC_RPM": "fast"})


def test_expected_explicit_flag() -> None:
    assert not load_config(None, {}, env={}).expected_explicit
    assert load_config(None, {"columns.expected": "answer"}, env={}).expected_explicit


def test_extractor_replaces_context() -> None:
    cfg = load_config(None, {"columns.extractor": "mod:fn"}, env={})
    assert cfg.column_map.context is None and cfg.columns.extractor == "mod:fn"
