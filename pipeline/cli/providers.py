"""`ctxprec providers`: the provider registry (connectors/judges/providers.toml, plus a config's
[providers.NAME] tables): each `--model` prefix with its key variables, base URL, API kind and
batch API, and whether its key is set in this environment (never the key itself).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ctxprec.config import load_config
from ctxprec.connectors.judges.catalog import ProviderSpec, prices_taken, providers
from ctxprec.storage.core.seams import DEFAULT, Seams

__all__ = ["add_providers_command", "provider_rows", "render_providers", "run_providers_command"]


def add_providers_command(sub: Any) -> None:
    p = sub.add_parser(
        "providers", help="list the judge providers (--model PROVIDER/MODEL): key variable, URL"
    )
    p.add_argument("--config", type=Path, help="TOML config whose [providers.NAME] tables count")
    p.add_argument("--json", action="store_true", help="print JSON")


def _key_state(spec: ProviderSpec) -> str:
    if any(os.environ.get(v, "").strip() for v in spec.key_env):
        return "set"
    return {"never": "none needed", "remote": "not set (none for localhost)"}.get(
        spec.key_required, "not set"
    )


def provider_rows(table: dict[str, ProviderSpec]) -> list[dict[str, Any]]:
    return [
        {
            "provider": spec.id,
            "name": spec.name,
            "key_env": list(spec.key_env),
            "key_header": spec.key_header,
            "key": _key_state(spec),
            "base_url": spec.base_url,
            "kind": spec.kind,
            "batch_api": spec.batch,
            "aliases": list(spec.aliases),
        }
        for spec in sorted(table.values(), key=lambda s: s.id)
    ]


def render_providers(rows: list[dict[str, Any]]) -> str:
    lines = [
        "ctxprec judge providers: --model PROVIDER/MODEL (offline needs none of this)",
        f"{'provider':<12} {'key variable (first set wins)':<62} {'key':<12} base URL",
    ]
    for r in rows:
        names = " or ".join(r["key_env"]) or "-"
        extra = [f"batch API: {r['batch_api']}"] if r["batch_api"] else []
        if r["key_header"].lower() != "authorization":
            extra.append(f"key in {r['key_header']} header")
        if r["kind"] != "openai-chat":
            extra.append(r["kind"])
        if r["aliases"]:
            extra.append("also " + ", ".join(f"{a}/" for a in r["aliases"]))
        tail = f"  [{'; '.join(extra)}]" if extra else ""
        key = r["key"].split(" (")[0]
        lines.append(f"{r['provider']:<12} {names:<62} {key:<12} {r['base_url']}{tail}")
    lines.append(
        "--base-url URL (or [judge] base_url) replaces a provider's URL and keeps its key "
        "variable and header; [providers.NAME] in a config adds or changes a provider. Known "
        f"prices (ctxprec estimate) taken {prices_taken()}."
    )
    return "\n".join(lines)


def run_providers_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    cfg = load_config(args.config, {})
    rows = provider_rows(providers(cfg.judge.providers))
    print(json.dumps(rows, indent=2) if args.json else render_providers(rows))
    return 0
