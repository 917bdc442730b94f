"""The one frozen, validated run configuration: the sections of `storage/core/settings.py`
composed. Precedence: CLI flag > environment > TOML file > defaults; every default, env var and
flag of a setting is written once, on its field there. Secrets are never part of it (only env
var names).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxprec.connectors.judges.catalog import known_price, provider_table
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.settings import (
    SECTIONS,
    ColumnMap,
    ColumnsSettings,
    GateSettings,
    JudgeSettings,
    LimitsSettings,
    MlflowSettings,
    OtelSettings,
    OutputSettings,
    Price,
    RunSettings,
    ScoringSettings,
    StorageSettings,
    settings,
)

__all__ = [
    "API_OPTIONS",
    "AUDIT_OPTIONS",
    "DEFAULTS",
    "ENV_VARS",
    "FLAGS",
    "MAP_FIELDS",
    "Config",
    "column_map_flags",
    "env_setting",
    "flag_type",
    "load_config",
    "map_pairs",
    "parse_duration",
    "where",
    "with_audit",
    "with_settings",
]

API_OPTIONS = "options"  # the origin of settings given to the Python API as options=
# dotted key -> default / env var -> dotted key / dotted key -> flag: read off the fields
DEFAULTS: dict[str, Any] = {s.key: s.default for s in settings()}
ENV_VARS: dict[str, str] = {s.env: s.key for s in settings() if s.env}
FLAGS: dict[str, str] = {s.key: s.flag for s in settings() if s.flag}


@dataclass(frozen=True, slots=True)
class Config:
    """A run's configuration: one settings object per TOML section, plus [prices]."""

    judge: JudgeSettings = field(default_factory=JudgeSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    columns: ColumnsSettings = field(default_factory=ColumnsSettings)
    scoring: ScoringSettings = field(default_factory=ScoringSettings)
    run: RunSettings = field(default_factory=RunSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)  # no secrets: storage/fs
    mlflow: MlflowSettings = field(default_factory=MlflowSettings)  # no secrets: MLflow's own
    otel: OtelSettings = field(default_factory=OtelSettings)  # no secrets: OTEL_EXPORTER_OTLP_*
    prices: Mapping[str, Price] = field(default_factory=dict)
    source_file: Path | None = None

    @property
    def column_map(self) -> ColumnMap:
        return self.columns.map

    def price_for(self, model: str) -> Price | None:
        """[prices."provider/model"] of the config, else the provider registry's known price."""
        return self.prices.get(model) or known_price(model)


# ---------------------------------------------------------------- field kinds


@functools.cache
def _section_hints(section: str) -> dict[str, Any]:
    """A settings section's annotations, evaluated once (get_type_hints evaluates every one of
    the class's string annotations on each call)."""
    return typing.get_type_hints(SECTIONS[section])


def _hint(key: str) -> Any:
    section, _, name = key.partition(".")
    return _section_hints(section)[name]


@functools.cache
def _kind(key: str) -> tuple[str, type]:
    """("scalar" | "list" | "table", element type) of a setting, from its annotation."""
    hint = _hint(key)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType):  # X | None
        hint = args[0]
        args = list(typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        inner = args[0]
        if typing.get_origin(inner) is tuple:
            return "table", str
        return "list", inner
    return "scalar", hint


def flag_type(key: str) -> type | None:
    """What argparse converts a setting's flag value to: int or float, else the string as
    given (lists, paths and strings are parsed by the loader)."""
    shape, kind = _kind(key)
    return kind if shape == "scalar" and kind in (int, float) else None


_NAMES = {bool: "boolean", int: "whole number", float: "number", str: "string", Path: "path"}


def _describe(key: str) -> str:
    shape, kind = _kind(key)
    if shape == "table":
        return "table of strings"
    if shape == "list":
        return "list" if kind is str else f"list of {_NAMES[kind]}s"
    return _NAMES[kind]


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _scalar(kind: type, value: Any) -> Any:
    """`value` as a `kind`; ValueError/TypeError when it is not one."""
    if kind is bool:
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, bool):
            return value
        raise ValueError(value)
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        if isinstance(value, str):
            return int(value.strip())
        if not isinstance(value, int | float):
            raise TypeError(value)
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(value)
        return float(value)
    if not isinstance(value, str):
        raise TypeError(value)
    if kind is Path:
        return Path(value).expanduser() if value else None
    return value


def _coerce(key: str, value: Any, origin: str) -> Any:
    """A value from TOML, the environment or a flag as the field's type, or a clear error."""
    shape, kind = _kind(key)
    try:
        if shape == "table":
            if not isinstance(value, Mapping):
                raise TypeError(value)
            return tuple((str(k), _scalar(str, v)) for k, v in value.items())
        if shape == "list":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple):
                raise TypeError(value)
            items = [x.strip() if isinstance(x, str) else x for x in items]
            return tuple(_scalar(kind, x) for x in items if x != "")
        return _scalar(kind, value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where(key, origin)} must be a {_describe(key)}, got {value!r}"
        ) from None


def where(key: str, origin: str) -> str:
    """A setting named as the user gave it: the flag, the env var, the TOML table entry or the
    option of the Python API (`create_context_precision_scorer(options=...)`)."""
    if origin == "command line":
        return FLAGS.get(key, key)
    if origin == API_OPTIONS:
        return f"option {key.partition('.')[2]!r}"
    if origin == "environment":
        var = next((v for v, k in ENV_VARS.items() if k == key), key)
        return f"{var} (environment)"
    section, _, name = key.partition(".")
    if origin == "defaults":
        return f"[{section}] {name}"
    return f"[{section}] {name} in {origin}"


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*", re.IGNORECASE)
_DURATION_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
                   "w": 604800.0}  # fmt: skip


def parse_duration(text: str, flag: str = "--batch-wait") -> float:
    """A duration flag's value in seconds: "0", "90" (seconds), "90s", "30m", "12h", "30d",
    "2w"; a ConfigError naming `flag` otherwise (the one parser of --batch-wait and
    --older-than)."""
    got = _DURATION.fullmatch(text)
    if got is None:
        raise ConfigError(f"{flag} {text!r}: give a duration such as 0, 90s, 30m, 12h, 30d or 2w")
    unit = (got.group(2) or "s").lower()
    return float(got.group(1)) * _DURATION_UNITS[unit]


# ---------------------------------------------------------------- the layers


_OWN_TABLES = ("prices", "providers")  # top-level tables read apart from the settings


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"limits": {"rpm": 60}} -> {"limits.rpm": 60}; a table inside a section stays one value
    (a table-valued setting such as [judge] extra_headers, or an unknown key)."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and prefix == "" and key not in _OWN_TABLES:
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.exists() or path.is_dir():  # a pipe (--config <(ctxprec config openai)) reads
        raise ConfigError(
            f"config file {path} does not exist; `ctxprec config` lists the example configs "
            "and `ctxprec config NAME > my.toml` writes one to start from"
        )
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    sink_tables = _sink_tables(data.pop("sinks"), path) if "sinks" in data else []
    flat = _flatten(data)
    unknown = sorted(k for k in flat if k not in DEFAULTS and k not in _OWN_TABLES)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; known sections: "
            + " ".join(f"[{s}]" for s in (*SECTIONS, *_OWN_TABLES))
        )
    if sink_tables:  # after [output] sinks, if both are given
        given = flat.get("output.sinks", [])
        given = given.split(",") if isinstance(given, str) else given
        flat["output.sinks"] = [*given, *sink_tables] if isinstance(given, list) else given
    return flat


_SINK_TABLE = '[[sinks]] tables of kind and table, e.g. kind = "iceberg" and table = "lake/ns.t"'


def _sink_tables(raw: Any, path: Path) -> list[str]:
    """`[[sinks]]` tables (kind = "iceberg", table = "lake/analytics.scores") as --sink specs."""
    entries = raw if isinstance(raw, list) else [raw]
    specs: list[str] = []
    for entry in entries:
        if (
            not isinstance(entry, Mapping)
            or set(entry) != {"kind", "table"}
            or not all(isinstance(v, str) and v.strip() for v in entry.values())
        ):
            raise ConfigError(f"config file {path}: sinks must be {_SINK_TABLE}, got {entry!r}")
        specs.append(f"{entry['kind'].strip()}:{entry['table'].strip()}")
    return specs


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    return {key: env[var] for var, key in ENV_VARS.items() if env.get(var, "") != ""}


def env_setting(key: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting as the environment alone gives it (else its default), checked as
    `load_config` checks it: for what is needed before any config file is read (the CLI's
    logging and tracebacks)."""
    env = os.environ if env is None else env
    given = _from_env(env)
    return _coerce(key, given[key], "environment") if key in given else DEFAULTS[key]


def _prices(raw: Any, origin: str) -> dict[str, Price]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[prices] in {origin} must be a table of tables")
    fields = dataclasses.fields(Price)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        try:
            given = [f.name for f in fields if f.name in required or entry.get(f.name) is not None]
            out[model] = Price(**{name: float(entry[name]) for name in given})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f'[prices."{model}"] in {origin} needs input_per_mtok and output_per_mtok numbers'
            ) from None
    return out


def load_config(
    path: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    flags_origin: str = "command line",
) -> Config:
    """Merge defaults < TOML file < environment < flags and validate the result. `flags` are
    dotted setting keys ({"judge.model": "openai/gpt-4o-mini"}) and "map", a column map as
    `--map` takes it ({"query": "question"} or "query=question,expected=ground_truth").
    `flags_origin` names where the flags came from in errors: the command line, or
    API_OPTIONS."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = dict(DEFAULTS)
    origins = dict.fromkeys(DEFAULTS, "defaults")
    file_values = _read_toml(path) if path is not None else {}
    prices = _prices(file_values.pop("prices", None), str(path))
    if "providers" in file_values:  # [providers.NAME]: registry providers added or changed
        merged["judge.providers"] = provider_table(file_values.pop("providers"), str(path))
    for layer, origin in (
        (file_values, str(path)),
        (_from_env(env), "environment"),
        (_flag_values(flags or {}, flags_origin), flags_origin),
    ):
        for key, value in layer.items():
            if value is None:
                continue
            merged[key] = _coerce(key, value, origin)
            origins[key] = origin
    return _built(merged, origins, prices, path)


def _built(
    merged: dict[str, Any], origins: dict[str, str], prices: Mapping[str, Price], path: Path | None
) -> Config:
    merged["judge.model"] = merged["judge.model"].strip()
    _validate(merged, origins)
    sections = {
        name: cls(**{f.name: merged[f"{name}.{f.name}"] for f in dataclasses.fields(cls)})
        for name, cls in SECTIONS.items()
    }
    return Config(**sections, prices=prices, source_file=path)


def with_settings(cfg: Config, values: Mapping[str, Any], origin: str = API_OPTIONS) -> Config:
    """`cfg` with some settings changed ({"judge.timeout_s": 5, "columns.query": "q"}, or
    "map" as in `load_config`), each checked as `load_config` checks a flag, the whole
    validated again: the Python API's options over a `Config` it was given."""
    merged = {s.key: getattr(getattr(cfg, s.section), s.name) for s in settings()}
    origins = dict.fromkeys(merged, "defaults")
    for key, value in _flag_values(values, origin).items():
        if value is not None:
            merged[key] = _coerce(key, value, origin)
            origins[key] = origin
    return _built(merged, origins, cfg.prices, cfg.source_file)


def _validate(v: dict[str, Any], origins: dict[str, str]) -> None:
    for s in settings():
        if s.rule is not None and not s.rule[0](v[s.key]):
            raise ConfigError(
                f"{where(s.key, origins[s.key])} must be {s.rule[1]}, got {v[s.key]!r}"
            )
    cache = v["run.cache_dir"]
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigError(
            f"{where('run.cache_dir', origins['run.cache_dir'])} is {cache}, a file, not a folder; "
            "give a folder for the memo (created if missing) or turn it off with --no-memo"
        )
    if not v["columns.context"] and not v["columns.extractor"]:
        raise ConfigError(
            "no context given: map a list<string> column with --map context=COLUMN "
            'or set [columns] extractor = "module:function"'
        )


# the [columns] roles `--map FIELD=COLUMN` (and a flags' "map") sets
MAP_FIELDS = tuple(s.name for s in settings() if s.flag and s.flag.startswith("--map "))


def map_pairs(given: str) -> list[str]:
    """`query=question,expected=ground_truth`: a comma starts a new pair only where a field
    name and `=` follow it, so a column named `a,b` still maps (`context=a,b`)."""
    fields = "|".join(sorted(MAP_FIELDS))
    return re.split(rf",\s*(?=(?:{fields})\s*=)", given)


def column_map_flags(given: Any, origin: str) -> dict[str, str]:
    """{"columns.FIELD": COLUMN} of a column map given as {"query": "question"}, as
    "query=question,expected=ground_truth" or a list of such strings (the CLI's `--map`)."""
    pairs: list[tuple[str, Any, str]]  # (field, column, as the user wrote it)
    if isinstance(given, Mapping):
        pairs = [(str(k), v, f"{k}={v}") for k, v in given.items()]
    else:
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list | tuple) or not all(isinstance(t, str) for t in texts):
            raise ConfigError(
                f"{_map_name(origin)} must be a mapping FIELD -> COLUMN, got {given!r}"
            )
        pairs = [(*p.partition("=")[::2], p) for t in texts for p in map_pairs(t)]
    out: dict[str, str] = {}
    for field_name, column, shown in pairs:
        name = field_name.strip()
        if name not in MAP_FIELDS or not isinstance(column, str) or not column.strip():
            raise ConfigError(
                f"{_map_name(origin)} {shown!r}: write FIELD=COLUMN with FIELD one of "
                f"{', '.join(sorted(MAP_FIELDS))}"
            )
        out[f"columns.{name}"] = column.strip()
    return out


def _map_name(origin: str) -> str:
    return "--map" if origin == "command line" else "the column map"


def _flag_values(flags: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Flags as dotted setting keys: a "map" entry becomes [columns] settings; an unknown key is
    a ConfigError (not a KeyError deep in the loader)."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if key == "map":
            out.update(column_map_flags(value, origin))
        elif key in DEFAULTS:
            out[key] = value
        else:
            raise ConfigError(
                f"unknown setting {key!r}; settings are dotted keys such as 'judge.model' or "
                "'columns.query' (ctxprec.config.DEFAULTS lists them), and 'map' a column map"
            )
    return out


AUDIT_OPTIONS = ("audit_model", "audit_fraction", "audit_seed", "audit_base_url")


def with_audit(cfg: Config, **given: Any) -> Config:
    """`cfg` with the audit judge's [judge] settings given to the Python API (`run_score(...,
    audit_model="openai/gpt-4.1", audit_fraction=0.05)`), checked as the CLI checks its flags."""
    if not given:
        return cfg
    values: dict[str, Any] = {}
    for name, value in given.items():
        if name not in AUDIT_OPTIONS:
            raise ConfigError(
                f"unknown option {name!r}; the audit options: {', '.join(AUDIT_OPTIONS)}"
            )
        key = f"judge.{name}"
        values[name] = _coerce(key, value, API_OPTIONS)
        rule = next(s.rule for s in settings() if s.key == key)
        if rule is not None and not rule[0](values[name]):
            raise ConfigError(f"{where(key, API_OPTIONS)} must be {rule[1]}, got {value!r}")
    return dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, **values))
