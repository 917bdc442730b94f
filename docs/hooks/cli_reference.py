"""MkDocs hook: docs/cli.md's reference is generated from the `ctxprec` argparse parser at build
time (`ctxprec.cli.main.build_parser`), so it cannot drift from the code. The page holds the
marker `<!-- cli-reference -->`; this hook puts every command's usage, description, options and
epilog in its place."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
ROOT = Path(__file__).resolve().parents[2]


def reference() -> str:
    """The whole reference as Markdown: the top level, then one section per subcommand."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ["COLUMNS"] = "80"  # argparse wraps help to the terminal: the page's width
    from ctxprec.cli.main import build_parser

    parser = build_parser()
    out = [_section("ctxprec", parser, level=2)]
    for name, sub in _subcommands(parser):
        out.append(_section(f"ctxprec {name}", sub, level=2))
        for child, deeper in _subcommands(sub):
            out.append(_section(f"ctxprec {name} {child}", deeper, level=3))
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices.items())
    return []


def _section(title: str, parser: argparse.ArgumentParser, level: int) -> str:
    parser.prog = title
    text = parser.format_help()
    return f"{'#' * level} `{title}`\n\n```text\n{text.rstrip()}\n```\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
