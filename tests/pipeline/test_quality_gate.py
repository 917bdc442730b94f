"""The gate's pieces: the threshold is "below X" (equal passes), exit 5 only when no row failed,
and `[gate] fail_under` in a config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxprec.analysis.quality_gate import GATE_EXIT, gate_exit, under_gate
from ctxprec.config import load_config
from ctxprec.storage.core.errors import ConfigError


def test_threshold_is_strictly_below() -> None:
    assert under_gate(0.6, 10, 0.6) is None
    assert under_gate(0.6 - 1e-15, 10, 0.6) is None  # float noise at the threshold passes
    assert under_gate(None, 0, 0.6) is None  # nothing scored: nothing to judge
    message = under_gate(0.55, 1234, 0.6)
    assert message is not None
    assert "0.5500" in message
    assert "0.0500 below" in message
    assert "1,234 scored rows" in message


def test_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_exit(0, None) == 0
    assert gate_exit(1, None) == 1
    assert gate_exit(0, "--fail-under 0.6 failed") == GATE_EXIT == 5
    assert "exit 5" in capsys.readouterr().err
    assert gate_exit(1, "--fail-under 0.6 failed") == 1
    err = capsys.readouterr().err
    assert "rows failed" in err
    assert "--fail-under" in err


def test_fail_under_from_config_file_and_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[judge]\nmodel = "offline"\n[gate]\nfail_under = 0.6\n')
    assert load_config(cfg, {}).gate.fail_under == 0.6
    assert load_config(cfg, {"gate.fail_under": 0.7}).gate.fail_under == 0.7
    assert load_config(None, {}).gate.fail_under is None
    cfg.write_text('[gate]\nfail_under = "high"\n')
    with pytest.raises(ConfigError, match=r"\[gate\] fail_under"):
        load_config(cfg, {})
