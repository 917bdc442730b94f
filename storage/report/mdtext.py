"""Text from the data made inert in the Markdown ctxprec writes (summary.md, compare.md): an id,
a group value, a path or a reason is shown as the characters it holds, never read as HTML, a
link, an image, emphasis, a table's column or a code span's end, whatever renders the file
(CommonMark, GitHub, markdown-it with linkify). Control and bidi characters are shown as
escapes (`ctxprec.storage.core.printable.visible`).
"""

from __future__ import annotations

import re
from typing import Any

from ctxprec.storage.core.printable import visible

__all__ = ["md_code", "md_text"]

# what Markdown reads as markup: backslash-escaped (every ASCII punctuation character may be);
# an underscore inside a word (http_500, output_tokens) is no emphasis and stays as it is
_MARKUP = re.compile(r"([\\`*\[\]{}|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
# what a linkifier reads as a link: a scheme's "//", "www.", a domain's or a file's ".", "@"
_LINKISH = re.compile(r"(?<=:)/|(?<=[A-Za-z0-9])\.(?=[A-Za-z])|@")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_SPACE = re.compile(r"\s+")


def md_text(value: Any) -> str:
    """`value` as Markdown text that shows exactly its characters, on one line: HTML's
    `& < >` as entities, Markdown's punctuation backslash-escaped, what a linkifier would make
    a link (`http://`, `www.`, `name.tld`, `a@b`) broken by escapes, newlines as spaces."""
    text = _SPACE.sub(" ", visible(str(value)))
    text = _MARKUP.sub(r"\\\1", text)
    text = _LINKISH.sub(lambda m: "\\" + m.group(), text)
    return "".join(_HTML.get(c, c) for c in text) if any(c in text for c in "&<>") else text


def md_code(value: Any) -> str:
    """`value` as a Markdown code span: fenced by one backtick more than its longest run of
    backticks, on one line, control and bidi characters as escapes. A code span is never
    HTML, a link or emphasis, and a linkifier leaves it alone."""
    text = _SPACE.sub(" ", visible(str(value)))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}" if text else "` `"
