"""What kind of entry a local path is, read through no link: the one check confine (an output
folder's fixed paths) and the memo folder (its database, lock and journals) both make before
they open, write or remove anything. Imports only the standard library: `ctxprec cache` and
`--help` reach it without PyArrow."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["LINK", "kind_problem"]

LINK = "a symbolic link"


def kind_problem(path: Path, folder: bool = False) -> str | None:
    """What is wrong with the kind of `path`, in words to follow "it is" (None: missing, a
    regular file, or with `folder` a real folder); a link is `LINK`, never followed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be inspected ({exc.strerror})"
    if stat.S_ISLNK(mode):
        return LINK
    if folder:
        return None if stat.S_ISDIR(mode) else "a file, not a folder"
    if stat.S_ISREG(mode):
        return None
    return "a folder, not a file" if stat.S_ISDIR(mode) else "not a regular file"
