"""The provider registry as data: `providers.toml` (shipped in the package) says, for each
`provider/` prefix of `--model`, its API kind, base URL, key variables, key header, whether a
key is required, its batch API and its known prices; a config's `[providers.NAME]` tables add
providers or override fields (`JudgeSettings.providers`). Judges read a `ProviderSpec`; nothing
here makes a request.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ctxprec.connectors.judges.secrets import checked_base_url, is_loopback, register_secret
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.seams import (
    KeySource,  # where API keys are read (the environment by default)
)
from ctxprec.storage.core.settings import Price, named

__all__ = [
    "DATA_FILE",
    "KINDS",
    "KeySource",
    "ProviderSpec",
    "ProviderTable",
    "builtin_providers",
    "closest",
    "known_price",
    "lookup",
    "prices_taken",
    "provider_table",
    "providers",
    "registry_prices",
]

DATA_FILE = "providers.toml"
KINDS = ("openai-chat", "anthropic-messages")
KEY_REQUIRED = ("always", "remote", "never")
BATCH_KINDS = ("openai", "anthropic")
_LISTS = ("key_env", "aliases")
# [providers.NAME] as JudgeSettings carries it: (name, ((field, value), ...)) with lists joined
ProviderTable = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HOW_TO_ADD = (
    'add one in a config: [providers.NAME] base_url = "https://.../v1", key_env = ["NAME_API_KEY"]'
    " (kind, key_header and key_required optional; `ctxprec providers` lists the known ones)"
)


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One provider of the registry (fields as in providers.toml)."""

    id: str
    name: str
    kind: str
    base_url: str
    key_env: tuple[str, ...]
    key_header: str = "Authorization"
    key_required: str = "always"
    base_url_env: str | None = None
    batch: str | None = None
    batch_endpoint: str = "/v1/chat/completions"
    aliases: tuple[str, ...] = ()

    def base(self, given: str | None) -> str:
        """The base URL: `given` (--base-url, [judge] base_url) wins, then base_url_env, then
        the registry's, with each {VAR} read from the environment (ConfigError when unset).
        Credentials in it are checked (`secrets.checked_base_url`)."""
        if given:
            return checked_base_url(given, named("judge.base_url"))
        if self.base_url_env and os.environ.get(self.base_url_env, "").strip():
            return checked_base_url(os.environ[self.base_url_env].strip(), self.base_url_env)

        def var(found: re.Match[str]) -> str:
            value = os.environ.get(found.group(1), "").strip()
            if not value:
                raise ConfigError(
                    f"provider {self.id} needs the environment variable {found.group(1)} for its "
                    f"URL {self.base_url} (or give the whole URL with {named('judge.base_url')})"
                )
            return value

        return checked_base_url(_VAR.sub(var, self.base_url), f"provider {self.id}")

    def key(
        self,
        model: str,
        base_url: str,
        key_env: str | None = None,
        key_source: KeySource | None = None,
    ) -> str | None:
        """The API key from the first of the provider's variables that is set (`key_env`, i.e.
        --api-key-env, replaces them), read from `key_source` (the environment unless given);
        missing is a ConfigError before any request, naming the variables, unless the provider
        needs none (here, or on localhost for "remote")."""
        names = (key_env,) if key_env else self.key_env
        read = key_source or os.environ.get
        for name in names:
            value = (read(name) or "").strip()
            if value:
                register_secret(value)
                return value
        if self.key_required == "never" or (
            self.key_required == "remote" and is_loopback(base_url)
        ):
            return None
        first, others = names[0] if names else "", " or ".join(names[1:])
        also = f" (or {others})" if others else ""
        local = "; servers on localhost need none" if self.key_required == "remote" else ""
        raise ConfigError(
            f"judge {model} needs an API key: set the environment variable {first}{also}; "
            f"{named('judge.api_key_env')} names another variable{local}"
        )

    def auth(self, key: str | None) -> dict[str, str]:
        """The key's header: a bearer token in Authorization, else the key as it is."""
        if key is None:
            return {}
        if self.key_header.lower() == "authorization":
            return {"Authorization": f"Bearer {key}"}
        return {self.key_header: key}


# ---------------------------------------------------------------- reading the data


_PRICES_HEADER = "\n[prices]\n"
_PRICE_LINE = re.compile(r'"([^"\\]+)"\s*=')  # `"provider/model" = { ... }`: one model's price


@functools.cache
def _sections() -> tuple[str, str]:
    """The data file split at its `[prices]` table, the last one: the providers part, and the
    prices (~600 lines, 90 % of the file; ~9 ms of tomllib that a run needs one line of). The
    whole file stays the providers part when [prices] is not last (then nothing is split)."""
    text = resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8")
    head, header, prices = text.partition(_PRICES_HEADER)
    if not header or re.search(r"^\s*\[", prices, re.MULTILINE):
        return text, ""
    return head, header + prices


@functools.cache
def _data() -> dict[str, Any]:
    """The data file but its [prices] table (`_all_prices` reads that)."""
    return tomllib.loads(_sections()[0])


@functools.cache
def _all_prices() -> dict[str, Any]:
    prices = _sections()[1]
    return dict(tomllib.loads(prices).get("prices", {}) if prices else _data().get("prices", {}))


@functools.cache
def _price_lines() -> dict[str, str]:
    """Each model's line of the [prices] table, unparsed, by model."""
    lines = _sections()[1].splitlines()
    return {m.group(1): line for line in lines if (m := _PRICE_LINE.match(line))}


def _price_of(entry: Mapping[str, Any]) -> Price:
    return Price(
        input_per_mtok=float(entry["input"]),
        output_per_mtok=float(entry["output"]),
        cached_input_per_mtok=None
        if entry.get("cached_input") is None
        else float(entry["cached_input"]),
    )


def _fields(name: str, entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A [providers.NAME] table as ProviderSpec fields, checked (ConfigError naming `where`)."""
    known = {f.name for f in dataclasses.fields(ProviderSpec)} - {"id"}
    out: dict[str, Any] = {}
    for field, value in entry.items():
        if field not in known:
            raise ConfigError(
                f"[providers.{name}] in {where}: unknown field {field!r}; known: "
                + ", ".join(sorted(known))
            )
        if field in _LISTS:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
                raise ConfigError(f"[providers.{name}] {field} in {where}: a list of strings")
            out[field] = tuple(v.strip() for v in items if v.strip())
        elif isinstance(value, str):
            out[field] = value.strip()
        else:
            raise ConfigError(f"[providers.{name}] {field} in {where} must be a string")
    rules = (("kind", KINDS), ("key_required", KEY_REQUIRED), ("batch", BATCH_KINDS))
    for field, allowed in rules:
        if field in out and out[field] not in allowed:
            raise ConfigError(
                f"[providers.{name}] {field} in {where} must be one of {', '.join(allowed)}, "
                f"got {out[field]!r}"
            )
    return out


def _spec(name: str, fields: Mapping[str, Any], base: ProviderSpec | None) -> ProviderSpec:
    if base is not None:
        return dataclasses.replace(base, **fields)
    missing = [f for f in ("base_url",) if not fields.get(f)]
    if missing:
        raise ConfigError(
            f"[providers.{name}] is a new provider: it needs base_url (and key_env unless it "
            'needs no key: key_required = "never")'
        )
    defaults: dict[str, Any] = {
        "name": name,
        "kind": "openai-chat",
        "key_env": (f"{re.sub(r'[^A-Z0-9]', '_', name.upper())}_API_KEY",),
    }
    return ProviderSpec(id=name, **{**defaults, **fields})


@functools.cache
def builtin_providers() -> dict[str, ProviderSpec]:
    """The registry shipped in providers.toml, by id."""
    table = _data()["providers"]
    return {
        name.lower(): _spec(name.lower(), _fields(name, entry, DATA_FILE), None)
        for name, entry in table.items()
    }


def provider_table(raw: Any, where: str) -> ProviderTable:
    """A config's [providers] table checked and frozen into the form JudgeSettings carries."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[providers] in {where} must be a table of [providers.NAME] tables")
    out = []
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            raise ConfigError(f"[providers.{name}] in {where} must be a table")
        fields = _fields(name, entry, where)
        flat = tuple(
            (k, ",".join(v) if isinstance(v, tuple) else str(v)) for k, v in fields.items()
        )
        out.append((name.lower(), flat))
    providers(tuple(out))  # a new provider lacking its base URL fails here, with the file
    return tuple(out)


@functools.cache
def providers(extra: ProviderTable = ()) -> dict[str, ProviderSpec]:
    """The registry with a config's [providers.NAME] tables applied, by id."""
    out = dict(builtin_providers())
    for name, flat in extra:
        fields = _fields(name, dict(flat), "the config")
        base = out.get(name) or _by_alias(out).get(name)
        spec = _spec(name, fields, base)
        out[spec.id] = spec
    return out


def _by_alias(table: Mapping[str, ProviderSpec]) -> dict[str, ProviderSpec]:
    return {alias.lower(): spec for spec in table.values() for alias in spec.aliases}


def closest(name: str, names: list[str]) -> list[str]:
    """Up to three known names nearest to `name` (difflib), best first."""
    found = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    return found or difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.3)


def lookup(
    provider: str, model: str, extra: ProviderTable = (), others: tuple[str, ...] = ()
) -> ProviderSpec:
    """The provider named by a model's prefix (an id or an alias); an unknown one is a
    ConfigError naming the closest known names and how to add one. `others` are prefixes known
    outside the registry (offline, plugins), offered as suggestions too."""
    table = providers(extra)
    spec = table.get(provider) or _by_alias(table).get(provider)
    if spec is not None:
        return spec
    served = serving(model)
    if served:
        raise ConfigError(
            f"model {model!r} names no provider: did you mean {' or '.join(served)}? "
            "(a judge model is written provider/model)"
        )
    names = sorted({*table, *_by_alias(table), *others})
    near = closest(provider, names)
    hint = f"the closest known: {', '.join(near)}; " if near else ""
    raise ConfigError(
        f"unknown judge provider {provider!r} in model {model!r}; {hint}all known: "
        f"{', '.join(sorted({*table, *others}))}. For another OpenAI-compatible server, "
        f"{_HOW_TO_ADD}, or use openai/<model> with {named('judge.base_url')}"
    )


def serving(model: str) -> list[str]:
    """`provider/model` of the registry's providers that serve `model` (a model written
    without its provider: gpt-4o-mini -> openai/gpt-4o-mini), first-party providers first."""
    if "/" in model:
        return []
    by_name: dict[str, list[str]] = {}
    for known in registry_prices():
        provider, name = known.split("/", 1)
        by_name.setdefault(name, []).append(provider)
    if model not in by_name:  # a name the registry does not list: the nearest one it does
        first_party = [n for n, ps in by_name.items() if set(ps) & set(_FIRST_PARTY)]
        near = difflib.get_close_matches(model, first_party, n=1, cutoff=0.6)
        near = near or difflib.get_close_matches(model, list(by_name), n=1, cutoff=0.6)
        if not near:
            return []
        model = near[0]
    providers = by_name[model]
    first = [p for p in providers if p in _FIRST_PARTY]
    return [f"{p}/{model}" for p in (first or providers)[:3]]


_FIRST_PARTY = ("openai", "anthropic", "google", "mistral", "deepseek", "xai")


# ---------------------------------------------------------------- prices


@functools.cache
def registry_prices() -> dict[str, Price]:
    """Every price of the registry, by `provider/model` (the whole [prices] table parsed)."""
    return {model: _price_of(entry) for model, entry in _all_prices().items()}


@functools.cache
def _registry_price(model: str) -> Price | None:
    """One model's price: its line of the [prices] table alone is parsed (a line that is not a
    plain `"model" = {...}` makes the whole table parsed instead)."""
    if not _sections()[1]:
        return registry_prices().get(model)
    line = _price_lines().get(model)
    if line is None:
        return None
    entry = tomllib.loads(line).get(model)
    return _price_of(entry) if isinstance(entry, Mapping) else registry_prices().get(model)


_FREE = Price(input_per_mtok=0.0, output_per_mtok=0.0)  # the built-in offline judge


def known_price(model: str) -> Price | None:
    """The registry's price of a `provider/model` (an alias prefix counts as its provider);
    the offline judge (`offline`, `offline/VARIANT`) calls no provider: it costs 0."""
    if model.partition("/")[0] == "offline":
        return _FREE
    price = _registry_price(model)
    if price is not None:
        return price
    provider, _, name = model.partition("/")
    spec = _by_alias(builtin_providers()).get(provider.lower())
    return _registry_price(f"{spec.id}/{name}") if spec is not None else None


def prices_taken() -> str:
    """When the registry's prices were taken (YYYY-MM-DD)."""
    return str(_data().get("prices_taken", "unknown"))
