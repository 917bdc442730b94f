"""`ctxprec view` in a real browser (headless Chromium through Playwright, the Debian package's
binary): the page asks nothing of any other host, logs no console error, shows summary.json's
figures, searches, filters, pages and opens rows and pairs, and shows hostile markup in ids,
queries, groups and items as text that runs nothing; screenshots at 1280 and 390 px, light and
dark, with no sideways overflow. Without Chromium or Playwright the tests skip, except under
CI=true, where they fail."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import polars as pl
import pytest

from tests.fakes.browser import browser_or_skip, chromium
from tests.fakes.inputs import REPO, SAMPLE
from tests.fakes.viewer import HOSTILE, Viewer, get, make_outputs, viewer


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    browser_or_skip()
    return make_outputs(tmp_path_factory.mktemp("view-browser"))


@pytest.fixture(scope="module")
def server(outputs: tuple[Path, Path]) -> Iterator[Viewer]:
    with viewer(*outputs) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


class Page:
    """One page of the viewer with what it asked for and what it logged."""

    def __init__(self, browser: Any, server: Viewer, width: int, scheme: str) -> None:
        self.origin = server.url.rstrip("/")
        self.page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=scheme)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(server.url)
        self.ready()

    def ready(self) -> None:
        self.page.wait_for_selector("body[data-ready='1']")
        self.page.wait_for_load_state("networkidle")

    def total(self, rows: str) -> None:
        """Wait until the page says `rows` match (no script evaluated: the CSP forbids eval)."""
        expect(self.page.locator("#count")).to_have_attribute("data-total", rows)

    def where(self, text: str) -> None:
        expect(self.page.locator("#where")).to_have_text(text)

    def count(self) -> int:
        return int(self.page.get_attribute("#count", "data-total") or -1)

    def ids(self) -> list[str]:
        return self.page.eval_on_selector_all(
            "#rows tbody tr[data-id]", "t => t.map(r => r.dataset.id)"
        )

    def answer(self, path: str) -> dict[str, Any]:
        """What the API says to `path`, to wait for the page to show it."""
        status, _, body = get(self.origin + path)
        assert status == 200, body
        found: dict[str, Any] = body
        return found

    def clean(self) -> None:
        assert self.errors == []
        hosts = {urlsplit(u).netloc for u in self.requests if not u.startswith("data:")}
        assert hosts == {urlsplit(self.origin).netloc}, self.requests
        assert self.page.evaluate("window.__pwned") is None


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def test_figures_are_summary_json_s(
    browser: Any, server: Viewer, outputs: tuple[Path, Path]
) -> None:
    view = Page(browser, server, 1280, "light")
    for side, out in zip("ab", outputs, strict=True):
        card = f"#figures .output[data-side='{side}']"
        s = summary(out)
        shown = view.page.get_attribute(f"{card} [data-figure='rows'] dd", "data-value")
        assert shown == str(s["rows"]["total"])
        assert (
            view.page.text_content(f"{card} [data-figure='rows'] dd") == f"{s['rows']['total']:,}"
        )
        mean = view.page.text_content(f"{card} [data-figure='mean'] dd")
        assert mean == str(s["score"]["mean"])
    assert view.count() == 16
    view.clean()


def test_search_filter_page_and_open_a_row(browser: Any, server: Viewer) -> None:
    view = Page(browser, server, 1280, "light")
    view.page.fill("#q", "berlin")
    view.total("1")
    assert view.ids() == ["q008"]
    view.page.fill("#q", "")
    view.page.select_option("#status", "empty_context")
    view.total("1")
    view.page.select_option("#status", "")
    view.page.select_option("#band", "excellent")
    excellent = view.answer("/api/rows?band=excellent")["total"]
    assert 0 < excellent < 16
    view.total(str(excellent))
    view.page.select_option("#band", "")
    view.page.select_option("#group", label="retriever = dense (6)")
    view.total("6")
    view.page.select_option("#group", "")
    view.page.select_option("#size", "10")
    view.page.select_option("#sort", "-score")
    want = [r["id"] for r in view.answer("/api/rows?sort=-score&size=10")["rows"]]
    view.where("page 1 of 2")
    expect(view.page.locator("#rows tbody tr[data-id]").last).to_have_attribute("data-id", want[-1])
    first = view.ids()
    assert first == want
    view.page.click("#next")
    view.where("page 2 of 2")
    second = view.ids()
    assert len(second) == 6
    assert not set(first) & set(second)
    view.page.click("#first")
    view.where("page 1 of 2")
    view.page.click("#rows tbody tr[data-id='q001']")
    view.page.wait_for_selector("dialog[open] .item")
    assert view.page.locator("dialog .item").count() == 4
    assert "adds 0.3333 to AP" in (view.page.text_content("dialog") or "")
    view.page.click("#close")
    view.clean()


def test_hostile_values_show_as_text(browser: Any, server: Viewer) -> None:
    view = Page(browser, server, 1280, "light")
    view.page.fill("#q", "hostile")
    view.total("4")
    text = view.page.text_content("#rows") or ""
    for hostile in HOSTILE:
        assert f"Hostile {HOSTILE.index(hostile)}: {hostile}" in text
    assert '<b onmouseover="window.__pwned=1">x</b>' in text  # a group value
    for i in range(len(HOSTILE)):
        view.page.locator("#rows tbody tr[data-id]").nth(i).click()
        view.page.wait_for_selector("dialog[open] .item")
        body = view.page.text_content("dialog") or ""
        assert any(h in body for h in HOSTILE)
        view.page.click("#close")
    assert view.page.evaluate("document.querySelectorAll('script').length") == 1
    made = "document.querySelectorAll('img, svg, [onload], [onerror], [onmouseover]').length"
    assert view.page.evaluate(made) == 0
    view.clean()


def test_compare_view_pairs_rows(browser: Any, server: Viewer) -> None:
    view = Page(browser, server, 1280, "light")
    view.page.click("#tabs button[data-view='compare']")
    view.total("16")
    view.page.check("#changed")
    changed = view.answer("/api/compare?changed=1&sort=change")
    assert 0 < changed["total"] < 16
    view.total(str(changed["total"]))
    view.page.select_option("#sort", "change")
    first = changed["rows"][0]["id"]
    expect(view.page.locator("#rows tbody tr[data-id]").first).to_have_attribute("data-id", first)
    view.page.locator("#rows tbody tr[data-id]").first.click()
    view.page.wait_for_selector("dialog[open] .pair")
    assert view.page.locator("dialog .pair .side h3").first.text_content().startswith("A: ")
    view.clean()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 390])
def test_screenshots_fit_the_width(
    browser: Any, server: Viewer, width: int, scheme: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.getbasetemp() / "view-shots"
    shots.mkdir(exist_ok=True)
    view = Page(browser, server, width, scheme)
    overflow = "document.documentElement.scrollWidth - window.innerWidth"
    assert view.page.evaluate(overflow) <= 0
    view.page.screenshot(path=str(shots / f"rows-{width}-{scheme}.png"), full_page=True)
    view.page.locator("#rows tbody tr[data-id='q002']").click()
    view.page.wait_for_selector("dialog[open] .item")
    view.page.screenshot(path=str(shots / f"row-{width}-{scheme}.png"))
    view.page.click("#close")
    view.page.click("#tabs button[data-view='compare']")
    expect(view.page.locator("#rows thead")).to_contain_text("B − A")
    assert view.page.evaluate(overflow) <= 0
    view.page.locator("#rows tbody tr[data-id]").first.click()
    view.page.wait_for_selector("dialog[open] .pair")
    view.page.screenshot(path=str(shots / f"pair-{width}-{scheme}.png"))
    view.clean()


def test_a_search_the_output_cannot_answer_says_why_on_the_page(
    browser: Any, tmp_path: Path
) -> None:
    """An output scored without its query texts: the box says it searches ids, and a search
    that finds nothing says why under it instead of an empty table alone."""
    src = tmp_path / "in.parquet"
    pl.read_parquet(SAMPLE).write_parquet(src)
    out = tmp_path / "out"
    args = ["score", str(src), "-o", str(out), "--progress", "off", "--quiet"]
    done = subprocess.run([sys.executable, "-m", "ctxprec", *args], capture_output=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    with viewer(out) as running:
        view = Page(browser, running, 1280, "light")
        assert (
            view.page.get_attribute("#q", "placeholder") == "id (this output keeps no query text)"
        )
        assert view.page.is_hidden("#search-note")
        view.page.fill("#q", "berlin")
        view.total("0")
        expect(view.page.locator("#search-note")).to_have_text(
            "this output keeps no query text, so a search matches ids only: score with "
            "--passthrough query to search the queries"
        )
        view.page.fill("#q", "")
        view.total("12")
        assert view.page.is_hidden("#search-note")
        view.clean()
