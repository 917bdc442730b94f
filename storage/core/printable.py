"""Text that came from outside (a server's error body, a header, a file's contents, an id or a
reason from the data) made fit for a terminal, a log line, a stored error or a page: control
characters (NUL, ANSI escapes, carriage returns) and bidi controls (U+202E shows
"\u202egnp.exe" as "exe.png") shown as escapes, so nothing a server or a row sends can move the
cursor, recolour, hide or reorder text on the operator's screen. Standard library only."""

from __future__ import annotations

import re

__all__ = ["printable", "shown", "visible"]


def printable(text: str, limit: int | None = None, *, lines: bool = False) -> str:
    """`text` with every non-printable character but space shown as its Python escape
    (`\\x1b`, `\\x00`, `\\r`, `\\u202e`; with `lines`, newlines are kept); clipped to
    `limit` characters when given."""
    text = shown(text, "\n" if lines else "")
    return text if limit is None else text[:limit]


def shown(text: str, keep: str = "") -> str:
    """`text` with every non-printable character but space and those in `keep` as its Python
    escape."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text
    )


# controls but tab and newline, and the bidi controls (embeddings, overrides, isolates, marks)
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode()


def visible(text: str) -> str:
    """`text` for a page or a Markdown file: control characters (but tab and newline) and bidi
    controls as escapes (`\\u202e`), every other character as it is."""
    return _HIDDEN.sub(_escape, text)
