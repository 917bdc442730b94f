"""`ctxprec config [NAME]`: the example configs shipped with the package (the repository's
configs/*.toml: pipeline/configs links to that folder, so there is one copy), written to stdout
to start one's own:
`ctxprec config openai > my.toml`."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from typing import Any

from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.seams import DEFAULT, Seams

__all__ = ["add_config_command", "example_configs", "run_config_command"]


def example_configs() -> dict[str, str]:
    """{name: TOML text} of every example config in the installed package."""
    folder = resources.files("ctxprec") / "configs"
    return {
        entry.name.removesuffix(".toml"): entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".toml")
    }


def add_config_command(sub: Any) -> None:
    names = ", ".join(example_configs())
    co = sub.add_parser(
        "config",
        help="write an example config to stdout (ctxprec config openai > my.toml)",
        description=f"Example configs, each commented: {names}. Without NAME, list them.",
    )
    co.add_argument("name", nargs="?", metavar="NAME", help=f"one of {names}")


def run_config_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    configs = example_configs()
    if args.name is None:
        for name, text in configs.items():
            first = text.splitlines()[0].lstrip("# ") if text else ""
            print(f"{name:<10} {first}")
        print("write one out with: ctxprec config NAME > my.toml, then --config my.toml")
        return 0
    if args.name not in configs:
        raise UserError(f"no example config {args.name!r}; there are {', '.join(configs)}")
    sys.stdout.write(configs[args.name])
    return 0
