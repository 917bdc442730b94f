"""Text that came from outside (a server's error body, a header, a file's contents) made fit
for a terminal, a log line or a stored error: control characters (NUL, ANSI escapes, carriage
returns) shown as escapes, so nothing a server sends can move the cursor, recolour or hide
text on the operator's screen. Standard library only."""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, limit: int | None = None, *, lines: bool = False) -> str:
    """`text` with every non-printable character but space shown as its Python escape
    (`\\x1b`, `\\x00`, `\\r`; with `lines`, newlines are kept); clipped to `limit`
    characters when given."""
    if not text.isprintable():
        text = "".join(
            c if c.isprintable() or (lines and c == "\n") else c.encode("unicode_escape").decode()
            for c in text
        )
    return text if limit is None else text[:limit]
