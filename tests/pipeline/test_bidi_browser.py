"""Bidi overrides and control characters where a person reads ids, reasons and items: an id
`\\u202egnp.exe` displayed as "exe.png" in summary.html, compare.html and the view's page. In a
real browser (headless Chromium, the Debian package's binary, through Playwright) every page
shows such characters as escapes (`\\u202e`, `\\x1b`): the text a person sees holds none of
them. Skips without Chromium or Playwright, except under CI=true."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.browser import browser_or_skip, chromium
from tests.fakes.hostile_judge import HostileJudge
from tests.fakes.runs import score
from tests.fakes.viewer import viewer

TRICKS = {
    "\u202e": "\\u202e",  # right-to-left override: "\u202egnp.exe" reads "exe.png"
    "\u2066": "\\u2066",  # left-to-right isolate
    "\u202a": "\\u202a",  # left-to-right embedding
    "\x1b": "\\x1b",
    "\x07": "\\x07",
}
ID = "\u202egnp.exe"
REASON = "fine\u2066 \u202aembedded\x1b[31m red\x07"


@pytest.fixture(scope="module")
def browser(outputs: dict[str, Path]) -> Iterator[Any]:
    """Chromium, started once the outputs are written (Playwright's loop runs in this thread,
    where an in-process `ctxprec score` could not start its own)."""
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two outputs whose ids, group values, items and judge reasons hold bidi and control
    characters, and their comparison."""
    browser_or_skip()
    root = tmp_path_factory.mktemp("bidi")
    source = root / "in.parquet"
    ids = [ID, "plain\x1b[2J", "third\u2066x"]
    pl.DataFrame(
        {
            "id": ids,
            "query": ["q1", "q2", "q3"],
            "grp": ["\u202egrp", "g2", "g2"],
            "contexts": [[f"item\u202e{i}", f"other{i}\x07"] for i in range(3)],
        }
    ).write_parquet(source)
    out: dict[str, Path] = {}
    monkey = pytest.MonkeyPatch()
    try:
        for side, relevant in (("a", True), ("b", False)):
            verdict = json.dumps({"relevant": relevant, "reason": REASON})
            with HostileJudge(lambda path, body, v=verdict: v) as judge:
                monkey.setenv("OPENAI_BASE_URL", judge.url)
                monkey.setenv("OPENAI_API_KEY", "sk-test-bidi-0123456789")
                out[side] = root / side
                assert score(source, "-o", out[side], "--model", "openai/judge-1",
                             "--group-by", "grp", "--passthrough", "grp,contexts") == 0  # fmt: skip
    finally:
        monkey.undo()
    out["compare"] = root / "compare"
    assert main(["compare", str(out["a"]), str(out["b"]), "-o", str(out["compare"])]) == 0
    return out


def assert_shown_as_escapes(text: str) -> None:
    for char in TRICKS:
        assert char not in text, repr(char)
    assert "\\u202egnp.exe" in text or "\\u202e" in text


def seen_text(browser: Any, url: str, click: str | None = None) -> str:
    """What a person sees of the page at `url` (document.body.innerText), after clicking
    `click` when given (a row that opens)."""
    page = browser.new_page()
    try:
        page.goto(url)
        if click is not None:
            page.locator(click).first.click()
        return str(page.evaluate("document.body.innerText"))
    finally:
        page.close()


def test_summary_html_shows_bidi_and_control_characters_as_escapes(
    browser: Any, outputs: dict[str, Path]
) -> None:
    text = seen_text(browser, (outputs["a"] / "summary.html").as_uri())
    assert_shown_as_escapes(text)
    opened = seen_text(browser, (outputs["a"] / "summary.html").as_uri(), "details summary")
    assert_shown_as_escapes(opened)


def test_compare_html_shows_bidi_and_control_characters_as_escapes(
    browser: Any, outputs: dict[str, Path]
) -> None:
    text = seen_text(browser, (outputs["compare"] / "compare.html").as_uri())
    assert_shown_as_escapes(text)
    opened = seen_text(browser, (outputs["compare"] / "compare.html").as_uri(), "details summary")
    assert_shown_as_escapes(opened)


def test_the_view_shows_bidi_and_control_characters_as_escapes(
    browser: Any, outputs: dict[str, Path]
) -> None:
    with viewer(outputs["a"]) as running:
        page = browser.new_page()
        try:
            page.goto(running.url)
            page.wait_for_selector("body[data-ready='1']")
            page.wait_for_selector("#rows tbody tr[data-id]")
            table = str(page.evaluate("document.body.innerText"))
            page.locator("#rows tbody tr[data-id]").first.click()
            page.wait_for_selector("dialog[open]")
            dialog = str(page.evaluate("document.querySelector('dialog').innerText"))
        finally:
            page.close()
    assert_shown_as_escapes(table)
    assert "\\u202egnp.exe" in table
    for char in TRICKS:
        assert char not in dialog
    assert "\\x1b[31m red\\x07" in dialog  # the judge's reason, as it holds it
