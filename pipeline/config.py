"""The one frozen, validated run configuration. Precedence: CLI flag > environment > TOML file >
defaults; every default lives in `DEFAULTS`. Secrets are never part of it (only env var names).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.judges.base import JudgeSettings
from connectors.sources import ColumnMap
from storage.core.errors import ConfigError
from storage.fs import StorageOptions

__all__ = ["DEFAULTS", "ENV_VARS", "FLAGS", "Config", "Price", "load_config", "where"]

DEFAULTS: dict[str, Any] = {
    "judge.model": "offline",
    "judge.base_url": None,
    "judge.api_key_env": None,
    "judge.temperature": 0.0,
    "judge.max_output_tokens": 200,
    "judge.timeout_s": 60.0,
    "judge.max_retries": 6,
    "judge.retry_budget_s": 300.0,
    "judge.structured_output": True,
    "judge.reasoning_effort": None,  # None: the lowest the model accepts (reasoning models)
    "judge.mode": "item",
    "judge.batch_api": False,
    "limits.concurrency": 32,
    "limits.rpm": None,
    "limits.tpm": None,
    "limits.adaptive": True,
    "columns.id": "id",
    "columns.query": "query",
    "columns.expected": "expected_output",
    "columns.context": "contexts",
    "columns.labels": None,
    "columns.extractor": None,
    "columns.passthrough": [],
    "scoring.scale": 1.0,
    "scoring.reason": "verdicts",
    "scoring.ks": [1, 3, 5],
    "run.batch_rows": 1000,
    "run.cache_dir": None,
    "run.memo": True,
    "run.max_item_chars": 200_000,
    "output.partition_by": [],
    "output.sinks": [],
    "output.group_by": None,
    "gate.fail_under": None,
    "storage.endpoint_url": None,
    "storage.region": None,
    "storage.anonymous": False,
}

# environment variable -> dotted key (values parsed like TOML scalars)
ENV_VARS: dict[str, str] = {
    "CTXPREC_MODEL": "judge.model",
    "CTXPREC_BASE_URL": "judge.base_url",
    "CTXPREC_CONCURRENCY": "limits.concurrency",
    "CTXPREC_RPM": "limits.rpm",
    "CTXPREC_TPM": "limits.tpm",
    "CTXPREC_CACHE_DIR": "run.cache_dir",
    "CTXPREC_BATCH_ROWS": "run.batch_rows",
}

_INT_KEYS = {
    "limits.concurrency",
    "judge.max_retries",
    "judge.max_output_tokens",
    "run.batch_rows",
    "run.max_item_chars",
}
_FLOAT_KEYS = {
    "judge.temperature",
    "judge.timeout_s",
    "judge.retry_budget_s",
    "limits.rpm",
    "limits.tpm",
    "scoring.scale",
    "gate.fail_under",
}
_BOOL_KEYS = {
    "judge.structured_output",
    "judge.batch_api",
    "limits.adaptive",
    "run.memo",
    "storage.anonymous",
}
_LIST_KEYS = {"columns.passthrough", "scoring.ks", "output.partition_by", "output.sinks"}


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens for one provider/model."""

    input_per_mtok: float
    output_per_mtok: float
    batch_input_per_mtok: float | None = None  # provider batch APIs; None: half the above
    batch_output_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None  # prompt tokens read from the provider's cache


@dataclass(frozen=True, slots=True)
class Config:
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    mode: str = "item"
    columns: ColumnMap = field(default_factory=ColumnMap)
    expected_explicit: bool = False
    extractor: str | None = None
    concurrency: int = 32
    rpm: float | None = None
    tpm: float | None = None
    adaptive: bool = True
    scale: float = 1.0
    reason: str = "verdicts"
    ks: tuple[int, ...] = (1, 3, 5)
    batch_rows: int = 1000
    cache_dir: Path | None = None
    memo: bool = True
    max_item_chars: int = 200_000
    partition_by: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    group_by: str | None = None
    fail_under: float | None = None  # [gate] fail_under: exit 5 below this mean score
    prices: Mapping[str, Price] = field(default_factory=dict)
    source_file: Path | None = None
    batch_api: bool = False  # send the judge's calls through the provider's batch API
    storage: StorageOptions = field(default_factory=StorageOptions)  # no secrets: see storage/fs

    def price_for(self, model: str) -> Price | None:
        return self.prices.get(model)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and prefix == "" and key != "prices":
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see configs/ for ready ones")
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat = _flatten(data)
    unknown = sorted(k for k in flat if k not in DEFAULTS and k != "prices")
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
            f"known sections: [judge] [limits] [columns] [scoring] [run] [output] [gate] "
            "[storage] [prices]"
        )
    return flat


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, key in ENV_VARS.items():
        if env.get(var, "") != "":
            out[key] = env[var]
    return out


def _coerce(key: str, value: Any, origin: str) -> Any:
    if value is None:
        return None
    try:
        if key in _BOOL_KEYS:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                    raise ValueError(value)
                return low in {"1", "true", "yes", "on"}
            return bool(value)
        if key in _INT_KEYS:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if key in _FLOAT_KEYS:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if key in _LIST_KEYS:
            items = value.split(",") if isinstance(value, str) else list(value)
            return [x.strip() if isinstance(x, str) else x for x in items if x != ""]
    except (TypeError, ValueError):
        raise ConfigError(f"{where(key, origin)} must be a {_kind(key)}, got {value!r}") from None
    if not isinstance(value, str):
        raise ConfigError(f"{where(key, origin)} must be a string, got {value!r}")
    return value


# dotted key -> the flag that sets it (for messages: a user typed the flag, not the key)
FLAGS: dict[str, str] = {
    "judge.model": "--model",
    "judge.base_url": "--base-url",
    "judge.api_key_env": "--api-key-env",
    "judge.mode": "--mode",
    "judge.timeout_s": "--timeout",
    "judge.max_retries": "--max-retries",
    "scoring.reason": "--reason",
    "columns.extractor": "--extractor",
    "columns.passthrough": "--passthrough",
    "run.batch_rows": "--batch-rows",
    "limits.concurrency": "--concurrency",
    "limits.rpm": "--rpm",
    "limits.tpm": "--tpm",
    "limits.adaptive": "--no-adaptive",
    "run.cache_dir": "--cache-dir",
    "run.memo": "--no-memo",
    "scoring.scale": "--scale",
    "scoring.ks": "--ks",
    "output.group_by": "--group-by",
    "output.partition_by": "--partition-by",
    "output.sinks": "--sink",
    **{f"columns.{f}": f"--map {f}=" for f in ("id", "query", "expected", "context", "labels")},
}


def where(key: str, origin: str) -> str:
    """A setting named as the user gave it: the flag, the env var or the TOML table entry."""
    if origin == "command line":
        return FLAGS.get(key, key)
    if origin == "environment":
        var = next((v for v, k in ENV_VARS.items() if k == key), key)
        return f"{var} (environment)"
    section, _, name = key.partition(".")
    if origin == "defaults":
        return f"[{section}] {name}"
    return f"[{section}] {name} in {origin}"


def _kind(key: str) -> str:
    if key in _BOOL_KEYS:
        return "boolean"
    if key in _INT_KEYS:
        return "whole number"
    if key in _FLOAT_KEYS:
        return "number"
    return "list"


def _prices(raw: Any, origin: str) -> dict[str, Price]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[prices] in {origin} must be a table of tables")
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        try:
            extra = [
                entry.get(k)
                for k in ("batch_input_per_mtok", "batch_output_per_mtok", "cached_input_per_mtok")
            ]
            out[model] = Price(
                float(entry["input_per_mtok"]),
                float(entry["output_per_mtok"]),
                *(None if x is None else float(x) for x in extra),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f'[prices."{model}"] in {origin} needs input_per_mtok and output_per_mtok numbers'
            ) from None
    return out


def load_config(
    path: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Merge defaults < TOML file < environment < flags and validate the result."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = dict(DEFAULTS)
    origins = dict.fromkeys(DEFAULTS, "defaults")
    file_values = _read_toml(path) if path is not None else {}
    prices = _prices(file_values.pop("prices", None), str(path))
    for layer, origin in (
        (file_values, str(path)),
        (_from_env(env), "environment"),
        (dict(flags or {}), "command line"),
    ):
        for key, value in layer.items():
            if value is None:
                continue
            merged[key] = _coerce(key, value, origin)
            origins[key] = origin
    return _build(merged, origins, prices, path)


def _build(
    v: dict[str, Any], origins: dict[str, str], prices: dict[str, Price], path: Path | None
) -> Config:
    _validate(v, origins)
    judge = JudgeSettings(
        model=str(v["judge.model"]).strip(),
        base_url=v["judge.base_url"],
        api_key_env=v["judge.api_key_env"],
        temperature=v["judge.temperature"],
        max_output_tokens=v["judge.max_output_tokens"],
        timeout_s=v["judge.timeout_s"],
        max_retries=v["judge.max_retries"],
        retry_budget_s=v["judge.retry_budget_s"],
        structured_output=v["judge.structured_output"],
        reasoning_effort=v["judge.reasoning_effort"],
    )
    columns = ColumnMap(
        id=v["columns.id"],
        query=v["columns.query"],
        expected=v["columns.expected"] or None,
        context=None if v["columns.extractor"] else v["columns.context"],
        labels=v["columns.labels"],
        passthrough=tuple(str(p).partition("=")[0].strip() for p in v["columns.passthrough"]),
        renames=_renames(v["columns.passthrough"]),
    )
    return Config(
        judge=judge,
        mode=v["judge.mode"],
        columns=columns,
        expected_explicit=origins["columns.expected"] != "defaults",
        extractor=v["columns.extractor"],
        concurrency=v["limits.concurrency"],
        rpm=v["limits.rpm"],
        tpm=v["limits.tpm"],
        adaptive=v["limits.adaptive"],
        scale=v["scoring.scale"],
        reason=v["scoring.reason"],
        ks=tuple(int(k) for k in v["scoring.ks"]),
        batch_rows=v["run.batch_rows"],
        cache_dir=Path(v["run.cache_dir"]).expanduser() if v["run.cache_dir"] else None,
        memo=v["run.memo"],
        max_item_chars=v["run.max_item_chars"],
        partition_by=tuple(v["output.partition_by"]),
        sinks=tuple(v["output.sinks"]),
        group_by=v["output.group_by"],
        fail_under=v["gate.fail_under"],
        prices=prices,
        source_file=path,
        batch_api=v["judge.batch_api"],
        storage=StorageOptions(
            endpoint_url=v["storage.endpoint_url"],
            region=v["storage.region"],
            anonymous=v["storage.anonymous"],
        ),
    )


def _renames(entries: list[Any]) -> tuple[tuple[str, str], ...]:
    """`--passthrough score=upstream_score`: copy `score` to the output as `upstream_score`."""
    out = []
    for entry in entries:
        source, sep, target = str(entry).partition("=")
        if sep:
            out.append((source.strip(), target.strip()))
    return tuple(out)


def _validate(v: dict[str, Any], origins: dict[str, str]) -> None:
    def bad(key: str, want: str) -> ConfigError:
        return ConfigError(f"{where(key, origins[key])} must be {want}, got {v[key]!r}")

    if v["judge.mode"] not in {"item", "row"}:
        raise bad("judge.mode", '"item" (one call per context item) or "row"')
    if v["scoring.reason"] not in {"verdicts", "llm"}:
        raise bad("scoring.reason", '"verdicts" (built from verdicts) or "llm"')
    if v["limits.concurrency"] < 1:
        raise bad("limits.concurrency", "at least 1")
    for key in ("limits.rpm", "limits.tpm"):
        if v[key] is not None and v[key] <= 0:
            raise bad(key, "a positive number (or unset for no limit)")
    if v["scoring.scale"] < 0:
        raise bad("scoring.scale", "zero or more")
    if v["run.batch_rows"] < 1:
        raise bad("run.batch_rows", "at least 1")
    cache = Path(v["run.cache_dir"]).expanduser() if v["run.cache_dir"] else None
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigError(
            f"{where('run.cache_dir', origins['run.cache_dir'])} is {cache}, a file, not a folder; "
            "give a folder for the memo (created if missing) or turn it off with --no-memo"
        )
    effort = v["judge.reasoning_effort"]
    if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh",
                                             "max"):  # fmt: skip
        raise bad("judge.reasoning_effort", "none, minimal, low, medium, high, xhigh or max")
    if v["judge.max_retries"] < 0:
        raise bad("judge.max_retries", "0 or more")
    if v["judge.timeout_s"] <= 0:
        raise bad("judge.timeout_s", "a positive number of seconds")
    ks = v["scoring.ks"]
    if not ks or any(not str(k).isdigit() or int(k) < 1 for k in ks):
        raise bad("scoring.ks", "a list of whole numbers >= 1")
    for entry in v["columns.passthrough"]:
        source, sep, target = str(entry).partition("=")
        if sep and (not source.strip() or not target.strip()):
            raise bad("columns.passthrough", "COL or COL=NEW_NAME entries")
    group_by = v["output.group_by"]
    if group_by is not None and "," in group_by:
        raise bad("output.group_by", "one column (the summary breaks scores down by one)")
    extractor = v["columns.extractor"]
    if extractor is not None and ":" not in extractor:
        raise bad("columns.extractor", '"module:function" or "path/to/file.py:function"')
    if not v["columns.context"] and not extractor:
        raise ConfigError(
            "no context given: map a list<string> column with --map context=COLUMN "
            'or set [columns] extractor = "module:function"'
        )
