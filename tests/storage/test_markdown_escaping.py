"""summary.md and compare.md carried raw HTML from the data: ids, group values and reasons
holding `<script>` or `<img onerror>` reached the Markdown as they were, and a common Markdown
viewer (markdown-it) ran them and sent a request out. Every Markdown file ctxprec writes is
rendered here by markdown-it-py (CommonMark with raw HTML on, and GitHub-like with linkify):
nothing from the data comes out as a tag, a link or an image, control and bidi characters come
out as escapes, and a `|` in a value adds no table column."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.report.mdtext import md_code, md_text
from tests.fakes.hostile_judge import HostileJudge
from tests.fakes.runs import score

markdown_it = pytest.importorskip("markdown_it")

EVIL = "evil.example"
PAYLOADS = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(2)">',
    f"[click](http://{EVIL}/a)",
    f"![pixel](https://{EVIL}/p.png)",
    f"<http://{EVIL}/auto>",
    f"http://{EVIL}/bare www.{EVIL} mail@{EVIL}",
    "a | b | c",
    "`code` ``more`` end`",
    "\u202egnp.exe",
    "\x1b[31mred\x07",
    "line one\n# not a heading\n[ref]: http://evil.example/ref",
    "*emph* __strong__ ~~gone~~ &amp; &lt;b&gt;",
    '"><svg onload=alert(3)>',
]
REASON = "; ".join(PAYLOADS)
_TAGS_OF_OURS = {
    "h1", "h2", "h3", "p", "ul", "li", "strong", "em", "code", "pre", "blockquote", "table",
    "thead", "tbody", "tr", "th", "td", "img", "br", "hr",
}  # fmt: skip


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def rendered(text: str) -> dict[str, str]:
    return {
        "commonmark": markdown_it.MarkdownIt("commonmark").enable("table").render(text),
        "gfm-like": markdown_it.MarkdownIt("gfm-like", {"linkify": True}).render(text),
    }


def assert_inert(md_file: Path) -> None:
    text = md_file.read_text(encoding="utf-8")
    assert "\u202e" not in text
    assert "\x1b" not in text
    for name, html in rendered(text).items():
        parser = Tags()
        parser.feed(html)
        for tag, attrs in parser.tags:
            assert tag in _TAGS_OF_OURS, (name, tag, attrs)
            assert not any(k.startswith("on") for k in attrs), (name, tag, attrs)
            for value in attrs.values():
                assert EVIL not in (value or ""), (name, tag, attrs)
                assert "://" not in (value or ""), (name, tag, attrs)
        assert "<script" not in html.lower()
        assert "\u202e" not in html


def table_widths(md_text: str) -> list[tuple[int, int]]:
    """(header columns, row columns) of every table row in the rendered Markdown."""
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md_text)
    out, width = [], 0
    for row in html.split("<tr>")[1:]:
        cells = row.count("<th") + row.count("<td")
        if "<th" in row:
            width = cells
        out.append((width, cells))
    return out


@pytest.fixture
def outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Two outputs of hostile rows (ids, group values, a judge's reasons) and their compare."""
    source = tmp_path / "in.parquet"
    pl.DataFrame(
        {
            "id": PAYLOADS,
            "query": [f"q{i}" for i in range(len(PAYLOADS))],
            "grp": [PAYLOADS[(i + 1) % len(PAYLOADS)] for i in range(len(PAYLOADS))],
            "contexts": [[f"c{i}", f"d{i}"] for i in range(len(PAYLOADS))],
        }
    ).write_parquet(source)
    out: dict[str, Path] = {}
    for side, relevant in (("a", "true"), ("b", "false")):
        verdict = json.dumps({"relevant": relevant == "true", "reason": REASON})
        with HostileJudge(lambda path, body, v=verdict: v) as judge:
            monkeypatch.setenv("OPENAI_BASE_URL", judge.url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-test-markdown-0123456789")
            out[side] = tmp_path / side
            code = score(source, "-o", out[side], "--model", "openai/judge-1", "--group-by", "grp",
                         "--passthrough", "grp")  # fmt: skip
            assert code == 0
    out["compare"] = tmp_path / "compare"
    assert main(["compare", str(out["a"]), str(out["b"]), "--group-by", "grp", "-o",
                 str(out["compare"])]) == 0  # fmt: skip
    return out


def test_summary_md_shows_the_data_as_text(outputs: dict[str, Path]) -> None:
    md = outputs["a"] / "summary.md"
    assert_inert(md)
    text = md.read_text(encoding="utf-8")
    html = rendered(text)["commonmark"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as the characters it holds
    assert "\\u202egnp.exe" in html
    assert all(header == cells for header, cells in table_widths(text)), table_widths(text)


def test_compare_md_shows_the_data_as_text(outputs: dict[str, Path]) -> None:
    md = outputs["compare"] / "compare.md"
    assert_inert(md)
    text = md.read_text(encoding="utf-8")
    html = rendered(text)["commonmark"]
    assert "&lt;img src=x onerror=" in html  # the reasons and ids are there, as text
    assert "\\x1b[31mred\\x07" in html
    assert all(header == cells for header, cells in table_widths(text)), table_widths(text)


def test_md_helpers_keep_figures_readable() -> None:
    assert md_text("0.5825") == "0.5825"
    assert md_text("http_500: 3") == "http_500: 3"
    assert md_text("+0.05 [-0.01, +0.1]") == "+0.05 \\[-0.01, +0.1\\]"
    assert md_code("a`b") == "``a`b``"
    assert md_code("data/x.parquet") == "`data/x.parquet`"
