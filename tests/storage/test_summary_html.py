"""summary.html and compare.html in a real browser: headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright; never a browser download) opens them from disk and
finds no console error, no request but the file itself, the figures of summary.json /
compare.json, rows that open to their items, hostile data shown as text that runs nothing, and
no horizontal overflow at laptop and phone widths, light and dark (screenshots in tmp_path).

Without Playwright or Chromium these tests skip, except under CI (CI=true), where they fail:
.ci/run installs both."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.figures import figure_text, percent_text
from ctxprec.storage.report.compare_text import signed
from tests.fakes.runs import score

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HOSTILE = [
    "<script>window.__pwned = 1</script>",
    '" onload="window.__pwned = 2" x="',
    '<img src=x onerror="window.__pwned = 3">',
    "</script><script>window.__pwned = 4</script>",
    "line\u2028separator\u2029and <b>bold</b> & &amp; done",
]
WIDTHS = (1280, 390)


def _chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    reason = None
    if importlib.util.find_spec("playwright") is None:
        reason = "playwright is not installed (it is in the test extra: pip install -e '.[test]')"
    elif found is None:
        reason = "chromium is not installed (apt-get install chromium; .ci/run installs it)"
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def browser(outputs: dict[str, Path]) -> Iterator[Any]:
    """Chromium, once the outputs are written (Playwright's sync API holds the thread's event
    loop while it runs, and a ctxprec run needs one of its own)."""
    path = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def _input(path: Path, reverse: bool = False) -> Path:
    """Twelve rows; some queries, items and group values are hostile markup."""
    ids, queries, contexts, expected, topics, labels = [], [], [], [], [], []
    for i in range(12):
        items = [
            f"Paris is the capital of France, fact {i}.",
            HOSTILE[i % len(HOSTILE)],
            f"Unrelated passage number {i} about rivers.",
        ]
        flags = [True, False, False]
        if reverse:
            items, flags = items[::-1], flags[::-1]
        ids.append(f"r{i:02d}" if i else '<script>window.__pwned = 5</script>"id')
        queries.append(HOSTILE[(i + 1) % len(HOSTILE)] + " What is the capital of France?")
        contexts.append(items if i != 11 else [])
        expected.append("Paris is the capital of France.")
        topics.append(HOSTILE[i % 3])
        labels.append(flags if i != 11 else [])
    table = pa.table(
        {
            "id": ids,
            "query": queries,
            "contexts": contexts,
            "expected_output": expected,
            "topic": topics,
            "labels": labels,
        }
    )
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("html")
    made = {}
    for name, reverse in (("a", False), ("b", True)):
        src = _input(root / f"{name}.parquet", reverse)
        code = score(
            src,
            "-o",
            root / name,
            "--map",
            "labels=labels",
            "--passthrough",
            "topic",
            "--group-by",
            "topic",
        )
        assert code == 0
        made[name] = root / name
    code = main(
        [
            "compare",
            str(made["a"]),
            str(made["b"]),
            "-o",
            str(root / "cmp"),
            "--fail-drop",
            "0.01",
            "--group-by",
            "topic",
        ]
    )
    assert code == 5  # the gate failed: B ranks the relevant item last
    made["cmp"] = root / "cmp"
    return made


class Page:
    """A page opened from disk with everything it tried to load and every error it printed."""

    def __init__(
        self,
        browser: Any,
        path: Path,
        width: int = 1280,
        scheme: str = "light",
        javascript: bool = True,
    ) -> None:
        self.context = browser.new_context(
            viewport={"width": width, "height": 900},
            color_scheme=scheme,
            java_script_enabled=javascript,
        )
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)

    def close(self) -> None:
        self.context.close()


def _clean(view: Page) -> None:
    """Nothing loaded but the file, nothing printed, nothing run."""
    assert view.requests == [view.url]
    assert view.errors == []
    page = view.page
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("script").count() == 0
    assert page.locator("img").count() == 0
    assert (
        page.evaluate(
            "[...document.querySelectorAll('*')].filter(e => [...e.attributes]"
            ".some(a => a.name.startsWith('on'))).length"
        )
        == 0
    )


def _figure(view: Page, name: str) -> str:
    return str(view.page.locator(f'[data-figure="{name}"]').first.inner_text()).strip()


def test_summary_shows_summary_json_and_loads_nothing(
    browser: Any, outputs: dict[str, Path]
) -> None:
    s = json.loads((outputs["a"] / "summary.json").read_text(encoding="utf-8"))
    view = Page(browser, outputs["a"] / "summary.html")
    try:
        _clean(view)
        assert _figure(view, "rows") == figure_text(s["rows"]["total"])
        assert _figure(view, "mean") == figure_text(s["score"]["mean"])
        scored = s["rows"]["ok"] + s["rows"]["empty_context"]
        assert _figure(view, "coverage") == percent_text(scored / s["rows"]["total"])
        for key, value in s["score"].items():
            assert view.page.locator(f'dd[data-figure="{key}"]').inner_text() == figure_text(value)
        ci = s["score_ci95"]
        assert (
            f"95 % CI {figure_text(ci['low'])}–{figure_text(ci['high'])}"
            in view.page.inner_text(".cards")
        )
        assert _figure(view, "estimate") == figure_text(s["estimate"]["mean"])
        text = view.page.inner_text("body")
        for band in s["bands"]:
            assert f"{band['band']}" in text
        assert "Agreement with human labels" in text
        assert "By topic" in text
    finally:
        view.close()


def test_a_row_opens_to_its_items_with_hostile_text_shown_as_text(
    browser: Any, outputs: dict[str, Path]
) -> None:
    view = Page(browser, outputs["a"] / "summary.html")
    try:
        rows = view.page.locator("details.row")
        assert rows.count() == 11  # every ok row: the worst 50 hold them all (the empty one is not)
        hostile = rows.filter(has_text=HOSTILE[0]).first
        assert not hostile.locator("ol.items").is_visible()
        hostile.locator("summary").click()
        items = hostile.locator("ol.items > li")
        assert items.count() == 3
        assert items.first.is_visible()
        assert "relevant" in items.first.inner_text()
        body = view.page.inner_text("body")
        for text in HOSTILE[:4]:
            assert text in body  # the markup, shown as text
        assert "window.__pwned = 5" in body  # a hostile id, too
        assert view.page.locator("b", has_text="bold").count() == 0
        _clean(view)  # opening rows ran nothing either
    finally:
        view.close()


def test_rows_open_without_javascript(browser: Any, outputs: dict[str, Path]) -> None:
    view = Page(browser, outputs["a"] / "summary.html", javascript=False)
    try:
        row = view.page.locator("details.row").first
        row.locator("summary").click()
        assert row.locator("ol.items > li").first.is_visible()
    finally:
        view.close()


def test_compare_shows_compare_json_and_both_item_lists(
    browser: Any, outputs: dict[str, Path]
) -> None:
    report = json.loads((outputs["cmp"] / "compare.json").read_text(encoding="utf-8"))
    view = Page(browser, outputs["cmp"] / "compare.html")
    try:
        _clean(view)
        assert _figure(view, "delta") == signed(report["mean_delta"])
        assert _figure(view, "mean_a") == figure_text(report["mean_a"])
        assert _figure(view, "gate") == ("FAILED" if report["gate"]["failed"] else "passed")
        moved = view.page.locator("details.row")
        assert moved.count() == len(report["biggest"]["wins"]) + len(report["biggest"]["losses"])
        first = moved.first
        first.locator("summary").click()
        sides = first.locator(".side > div")
        assert sides.count() == 2
        assert sides.nth(0).locator("ol.items > li").count() == 3
        assert sides.nth(1).locator("ol.items > li").count() == 3
        _clean(view)
    finally:
        view.close()


@pytest.mark.parametrize("name", ["a", "cmp"])
def test_no_overflow_at_laptop_and_phone_widths(
    browser: Any, outputs: dict[str, Path], tmp_path: Path, name: str
) -> None:
    file = outputs[name] / ("summary.html" if name == "a" else "compare.html")
    for width in WIDTHS:
        for scheme in ("light", "dark"):
            view = Page(browser, file, width, scheme)
            try:
                view.page.locator("details.row").first.locator("summary").click()
                assert view.page.evaluate("document.documentElement.scrollWidth") <= width
                bg = view.page.evaluate("getComputedStyle(document.body).backgroundColor")
                assert (bg == "rgb(13, 17, 23)") == (scheme == "dark")
                view.page.screenshot(
                    path=str(tmp_path / f"{name}-{width}-{scheme}.png"), full_page=True
                )
                _clean(view)
            finally:
                view.close()
