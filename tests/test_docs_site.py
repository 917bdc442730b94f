"""The docs site: every page under docs/ is in mkdocs.yml's nav (none orphaned, none missing),
and the CLI reference the site builds from the parser names every subcommand and flag."""

from __future__ import annotations

import importlib.util
import re

from ctxprec.cli.main import COMMANDS, build_parser
from tests.fakes.inputs import REPO


def _reference_module():  # type: ignore[no-untyped-def]
    path = REPO / "docs" / "hooks" / "cli_reference.py"
    spec = importlib.util.spec_from_file_location("cli_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_in_the_nav() -> None:
    nav = set(re.findall(r":\s*([\w-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M))
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages <= nav, f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == {"readme.md"}  # README.md, made a page by docs/hooks/readme_page.py


def test_the_cli_reference_is_the_parsers_help() -> None:
    text = _reference_module().reference()
    for command in COMMANDS:
        assert f"## `ctxprec {command}`" in text, command
    score = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices).choices[
        "score"
    ]
    for action in score._actions:
        for flag in action.option_strings:
            assert flag in text, flag
    assert "<!-- cli-reference -->" in (REPO / "docs" / "cli.md").read_text()
