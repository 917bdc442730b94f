"""Progress for long runs: a tqdm bar on a terminal, a log line every few seconds otherwise,
nothing in quiet mode; "notebook" (the Python API's `score_frame`) is tqdm.auto's bar, a widget
in Jupyter and text elsewhere. Reads the run counters on a timer instead of per item.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import anyio

from ctxprec.connectors.judges.base import JudgeStats
from ctxprec.flow.dispatch import RunCounters

__all__ = ["Progress"]


class Progress:
    def __init__(
        self,
        total_rows: int,
        counters: RunCounters,
        stats: JudgeStats,
        *,
        mode: str = "auto",
        stream: TextIO | None = None,
        log_every_s: float = 10.0,
    ):
        self.total = total_rows
        self.counters = counters
        self.stats = stats
        self.stream = stream or sys.stderr
        is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.mode = ("bar" if is_tty else "log") if mode == "auto" else mode
        self.log_every_s = log_every_s
        self._bar: object | None = None
        self._started = time.monotonic()
        self._last_log = 0.0

    def _rows(self) -> int:
        """Rows judged so far, plus rows finished by an earlier run or skipped."""
        c = self.counters
        return min(self.total, c.rows_skipped + c.rows_judged)

    def _postfix(self) -> str:
        c, s = self.counters, self.stats
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return (
            f"calls/s={c.calls_done / elapsed:.1f} memo={c.memo_hits} "
            f"retries={s.retries} 429s={s.rate_limited} failed={c.rows_failed}"
        )

    async def run(self) -> None:
        """Refresh until cancelled."""
        if self.mode == "off":
            return
        if self.mode == "notebook":
            from tqdm.auto import tqdm as auto_bar

            self._bar = auto_bar(total=self.total, unit="row", file=self.stream)
        elif self.mode == "bar":
            from tqdm import tqdm

            width = _fixed_width(self.stream)
            self._bar = tqdm(
                total=self.total,
                unit="row",
                file=self.stream,
                ncols=width,
                dynamic_ncols=width is None,
            )
        try:
            while True:
                self.refresh()
                await anyio.sleep(0.25)
        finally:
            self.refresh(final=True)

    def refresh(self, final: bool = False) -> None:
        if self._bar is not None:
            bar = self._bar
            bar.n = self._rows()  # type: ignore[attr-defined]
            bar.set_postfix_str(self._postfix(), refresh=False)  # type: ignore[attr-defined]
            bar.refresh()  # type: ignore[attr-defined]
            if final:
                bar.close()  # type: ignore[attr-defined]
                self._bar = None
            return
        now = time.monotonic()
        if self.mode == "log" and (final or now - self._last_log >= self.log_every_s):
            self._last_log = now
            rows = self._rows()
            pct = 100.0 * rows / self.total if self.total else 100.0
            print(
                f"ctxprec: {rows}/{self.total} rows ({pct:.0f}%) " + self._postfix(),
                file=self.stream,
                flush=True,
            )


def _fixed_width(stream: TextIO) -> int | None:
    """None: the bar follows the terminal's width. 80 columns when the terminal reports none
    (a pty of 0x0, as `script -c` and some CI runners give: a bar that follows a width of 0
    prints nothing for the whole run)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80
    return None if columns > 0 else 80
