"""The command's stdout and stderr while it runs: what is written has its control characters
escaped, and a reader that leaves (`| head -1`, a closed pipe) ends the printing, never the
command. Installed and removed by `ctxprec.cli.main.main`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["GuardedStream"]


class GuardedStream:
    """stdout or stderr for the length of a command: what is written passes through `clean`
    (control characters escaped, ctxprec.storage.core.printable), and a reader that left
    ends the printing, never the command: the rest goes to /dev/null and the command finishes
    with its own exit code (a failed gate's 5, failed rows' 1). `left` says whether the
    reader left."""

    def __init__(self, stream: Any, clean: Callable[[str], str]) -> None:
        self.stream, self.clean, self.left = stream, clean, False

    def write(self, text: str) -> int:
        try:
            self.stream.write(self.clean(text))
        except BrokenPipeError:
            self._gone()
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        # Python's recipe (docs "Note on SIGPIPE"): later writes and the final flush go nowhere
        self.left = True
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer...
        return getattr(self.stream, name)
