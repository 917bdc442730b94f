"""Configuration precedence (flag > env > file > defaults) and clear errors."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import pytest

from ctxprec import create_context_precision_scorer, run_evals
from ctxprec.cli.help import default_text
from ctxprec.cli.main import _flags, build_parser
from ctxprec.config import DEFAULTS, ENV_VARS, FLAGS, Config, load_config, parse_duration
from ctxprec.connectors.judges.batch.client import BatchLimits, limits_for
from ctxprec.limits.limiter import RateThrottle
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.settings import SECTIONS, settings


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_come_from_one_table() -> None:
    cfg = load_config(None, {}, env={})
    assert cfg.judge.model == DEFAULTS["judge.model"] == "offline"
    assert cfg.limits.concurrency == DEFAULTS["limits.concurrency"]
    assert cfg.column_map.context == "contexts"
    assert cfg.column_map.expected == "expected_output"
    assert cfg.scoring.ks == (1, 3, 5)


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[limits]\nconcurrency = 5\nrpm = 100\n[judge]\nmodel = "openai/x"\n')
    cfg = load_config(path, {}, env={})
    assert (cfg.limits.concurrency, cfg.limits.rpm, cfg.judge.model) == (5, 100.0, "openai/x")
    cfg = load_config(path, {}, env={"CTXPREC_CONCURRENCY": "7"})
    assert cfg.limits.concurrency == 7
    assert cfg.limits.rpm == 100.0
    cfg = load_config(path, {"limits.concurrency": 9}, env={"CTXPREC_CONCURRENCY": "7"})
    assert cfg.limits.concurrency == 9


def test_prices_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[prices."openai/m"]\ninput_per_mtok = 1.5\noutput_per_mtok = 6\n')
    price = load_config(path, {}, env={}).price_for("openai/m")
    assert price is not None
    assert price.output_per_mtok == 6.0


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
    assert not load_config(None, {}, env={}).columns.expected_explicit
    assert load_config(None, {"columns.expected": "answer"}, env={}).columns.expected_explicit


def test_extractor_replaces_context() -> None:
    cfg = load_config(None, {"columns.extractor": "mod:fn"}, env={})
    assert cfg.column_map.context is None
    assert cfg.columns.extractor == "mod:fn"


def test_the_api_and_the_cli_have_the_same_defaults() -> None:
    args = build_parser().parse_args(["score", "in.parquet", "-o", "out"])
    from_cli = load_config(args.config, _flags(args), env={})
    assert from_cli == Config() == load_config(None, {}, env={})
    scorer = create_context_precision_scorer(options={"context": ["a"]})
    assert scorer.judge.model == from_cli.judge.model
    assert scorer.scale == from_cli.scoring.scale
    assert scorer.reason_mode == from_cli.scoring.reason
    limits = from_cli.limits
    throttle = scorer.judge.throttle  # type: ignore[attr-defined]
    assert isinstance(throttle, RateThrottle)
    assert throttle.limits == (limits.concurrency, limits.rpm, limits.tpm, limits.adaptive)
    assert limits.concurrency == 32
    default = inspect.signature(run_evals).parameters["concurrency"].default
    assert default == limits.concurrency


def test_every_setting_has_a_toml_key_and_a_help_default(tmp_path: Path) -> None:
    for s in settings():
        assert s.help, s.key
        shown = default_text(s.key)
        assert shown if not isinstance(s.default, bool) else shown is None, s.key
        value = s.default
        if value is None or value == ():
            continue
        text = repr(value).lower() if isinstance(value, bool) else repr(value)
        text = text.replace("'", '"').replace("(", "[").replace(")", "]")
        text = text.replace(",]", "]")
        path = _toml(tmp_path, f"[{s.section}]\n{s.name} = {text}\n")
        assert load_config(path, {}, env={}) == Config(source_file=path), s.key
    fields = {f"{n}.{f.name}" for n, c in SECTIONS.items() for f in dataclasses.fields(c)}
    assert fields == set(DEFAULTS)


def test_every_flag_shows_its_default_in_help() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    score = subs.choices["score"]
    helps = {flag: str(a.help) for a in score._actions for flag in a.option_strings}
    for s in settings():
        text = default_text(s.key)
        if s.flag and not s.flag.startswith("--map") and text:
            assert f"(default: {text})" in helps[s.flag], s.flag
    assert "(default: id=id, query=query, expected=expected_output, context=contexts)" in " ".join(
        helps["--map"].split()
    )


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("judge.structured_output", 3, "boolean"),
        ("limits.concurrency", 2.5, "whole number"),
        ("limits.rpm", "fast", "number"),
        ("judge.model", 5, "string"),
        ("run.cache_dir", 5, "path"),
        ("scoring.ks", "1,x", "list of whole numbers"),
        ("output.partition_by", 7, "list"),
        ("judge.extra_headers", "X-A: b", "table of strings"),
    ],
)
def test_a_wrong_type_is_refused_naming_the_key(
    tmp_path: Path, key: str, value: object, kind: str
) -> None:
    section, _, name = key.partition(".")
    text = f'"{value}"' if isinstance(value, str) else str(value)
    path = _toml(tmp_path, f"[{section}]\n{name} = {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, env={})
    assert f"[{section}] {name} in {path} must be a {kind}, got" in str(info.value)
    if key in FLAGS:
        with pytest.raises(ConfigError, match=f"{FLAGS[key]} must be a {kind}"):
            load_config(None, {key: value}, env={})


def test_env_vars_come_from_the_fields() -> None:
    assert {s.env: s.key for s in settings() if s.env} == ENV_VARS
    assert ENV_VARS["CTXPREC_CONCURRENCY"] == "limits.concurrency"
    assert len(ENV_VARS) == 20
    env = {"CTXPREC_MODEL": "openai/x", "CTXPREC_BATCH_ROWS": "7", "CTXPREC_CACHE_DIR": "~/m"}
    cfg = load_config(None, {}, env=env)
    assert (cfg.judge.model, cfg.run.batch_rows) == ("openai/x", 7)
    assert cfg.run.cache_dir == Path("~/m").expanduser()
    with pytest.raises(ConfigError, match=r"CTXPREC_BATCH_ROWS \(environment\) must be a whole"):
        load_config(None, {}, env={"CTXPREC_BATCH_ROWS": "x"})


def test_batch_limits_and_polls_are_settings(tmp_path: Path) -> None:
    """CTXPREC_BATCH_MAX_* and CTXPREC_BATCH_POLL_* are [judge] settings: TOML keys and env
    vars, checked by the loader; the limits only ever lower the provider's."""
    path = _toml(tmp_path, "[judge]\nbatch_max_lines = 50\nbatch_poll_s = 0.5\n")
    env = {"CTXPREC_BATCH_MAX_BYTES": "1000", "CTXPREC_BATCH_POLL_MAX_S": "2"}
    cfg = load_config(path, {}, env=env)
    assert (cfg.judge.batch_max_lines, cfg.judge.batch_max_bytes) == (50, 1000)
    assert (cfg.judge.batch_poll_s, cfg.judge.batch_poll_max_s) == (0.5, 2.0)
    assert limits_for(BatchLimits(50_000, 10**9), cfg.judge) == BatchLimits(50, 1000)
    assert limits_for(BatchLimits(10, 10), cfg.judge) == BatchLimits(10, 10)
    assert limits_for(BatchLimits(7, 8), load_config(None, {}, env={}).judge) == BatchLimits(7, 8)
    with pytest.raises(ConfigError, match=r"CTXPREC_BATCH_MAX_LINES \(environment\) must be at"):
        load_config(None, {}, env={"CTXPREC_BATCH_MAX_LINES": "0"})
    with pytest.raises(ConfigError, match=r"CTXPREC_BATCH_POLL_S \(environment\) must be a pos"):
        load_config(None, {}, env={"CTXPREC_BATCH_POLL_S": "-1"})


def test_one_duration_parser_for_every_duration_flag() -> None:
    assert [parse_duration(t) for t in ("0", "90", "90s", "2 min", "30m", "2h", "1d")] == [
        0.0, 90.0, 90.0, 120.0, 1800.0, 7200.0, 86400.0,
    ]  # fmt: skip
    assert parse_duration("2w", "--older-than") == 14 * 86400.0
    with pytest.raises(ConfigError, match=r"^--older-than 'soon': give a duration such as 0"):
        parse_duration("soon", "--older-than")
    with pytest.raises(ConfigError, match=r"^--batch-wait '5y'"):
        parse_duration("5y")


def test_gate_storage_batch_api_effort_and_batch_prices(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[gate]\nfail_under = 0.5\n[storage]\nendpoint_url = "http://h:9"\nanonymous = true\n'
        '[judge]\nbatch_api = true\nreasoning_effort = "low"\n'
        '[judge.extra_headers]\n"X-Org" = "a"\n'
        '[prices."openai/m"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n'
        "batch_input_per_mtok = 0.4\n",
    )
    cfg = load_config(path, {}, env={})
    assert cfg.gate.fail_under == 0.5
    assert cfg.storage.anonymous
    assert cfg.storage.endpoint_url == "http://h:9"
    assert cfg.judge.batch_api
    assert cfg.judge.reasoning_effort == "low"
    assert cfg.judge.extra_headers == (("X-Org", "a"),)
    price = cfg.price_for("openai/m")
    assert price is not None
    assert price.batch_input_per_mtok == 0.4
    assert price.batch_output_per_mtok is None
    bad = _toml(tmp_path, '[judge]\nreasoning_effort = "huge"\n')
    with pytest.raises(ConfigError, match=r"reasoning_effort in .* must be none, minimal"):
        load_config(bad, {}, env={})


def test_unknown_settings_are_refused_with_the_known_sections(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_toml(tmp_path, "[output]\nsink = []\n"), {}, env={})
    message = str(info.value)
    assert "unknown setting(s) output.sink" in message
    assert (
        "[judge] [limits] [columns] [scoring] [run] [output] [gate] [storage] [mlflow] [otel] "
        "[prices]" in message
    )


def test_passthrough_is_parsed_from_the_section() -> None:
    cfg = load_config(None, {"columns.passthrough": "a, score=upstream"}, env={})
    section = cfg.columns  # the entries as given; the map parses them
    assert section.passthrough == ("a", "score=upstream")
    assert cfg.column_map.passthrough == ("a", "score")
    assert cfg.column_map.renames == (("score", "upstream"),)
    assert cfg.column_map.output_name("score") == "upstream"
