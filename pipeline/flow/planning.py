"""Planning a batch, written once: read -> drop ids already scored -> check rows -> memo keys ->
one memo lookup. The stage, the batch-API scan and the estimate all plan through here (so a
speed-up of any step lands in all three), and `open_memo` is where a run's memo is opened.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import polars as pl

from ctxprec.config import Config
from ctxprec.connectors.sources import SourceChunk, SourceInfo, iter_batches
from ctxprec.flow.extractor import Extractor, load_extractor
from ctxprec.flow.rows import RowPlan, attach_keys, plan_rows
from ctxprec.storage.memo.store import Memo, MemoEntry, MemoStore, default_cache_dir

__all__ = ["ChunkPlanner", "PlannedChunk", "check_memo", "open_memo"]


def open_memo(cfg: Config) -> Memo | None:
    """The run's memo (`--cache-dir`, else the user cache folder); None with `--no-memo`."""
    return Memo(cfg.run.cache_dir or default_cache_dir()) if cfg.run.memo else None


def check_memo(cfg: Config) -> None:
    """The run's memo folder opened once and closed before the output folder is touched: a
    link or an entry of the wrong kind in it, or a database that is not a memo's, is an
    OutputError while nothing is changed yet (the stages open it again when they start)."""
    memo = open_memo(cfg)
    if memo is not None:
        memo.close()


@dataclass(slots=True)
class PlannedChunk:
    """One input batch, planned: its rows as read (`batch.frame`), those left after dropping
    the ids already scored (`frame`, `dropped` rows fewer), their plans with memo keys, and
    the verdicts the memo already holds for those keys."""

    batch: SourceChunk
    frame: pl.DataFrame
    dropped: int
    rows: list[RowPlan]
    keys: list[str]
    found: dict[str, MemoEntry]


class ChunkPlanner:
    """Plans batches for one judge identity (`prefix`, see
    `ctxprec.storage.memo.store.judge_prefix`)."""

    def __init__(
        self,
        cfg: Config,
        prefix: bytes,
        *,
        per_row: bool,
        memo: MemoStore | None,
        skip_ids: pl.Series | None = None,
        extractor: Extractor | None = None,
    ) -> None:
        self.cfg = cfg
        self.prefix = prefix
        self.per_row = per_row
        self.memo = memo
        self.skip_ids = skip_ids if skip_ids is not None and skip_ids.len() else None
        if extractor is None and cfg.columns.extractor:
            extractor = load_extractor(cfg.columns.extractor)
        self.extractor = extractor

    def batches(
        self,
        info: SourceInfo,
        *,
        skip: Collection[str] = (),
        only_files: Collection[int] | None = None,
    ) -> Iterator[SourceChunk]:
        """The input's batches as read (parts in `skip` not read at all)."""
        cfg = self.cfg
        return iter_batches(
            info, cfg.column_map, batch_rows=cfg.run.batch_rows, skip=skip, only_files=only_files
        )

    def plan(self, batch: SourceChunk) -> PlannedChunk:
        """Blocking (the memo lookup): call it from a worker thread in async code."""
        frame = batch.frame
        if self.skip_ids is not None:
            frame = frame.filter(~pl.col("id").is_in(self.skip_ids.implode()))
        dropped = batch.frame.height - frame.height
        if frame.is_empty():
            return PlannedChunk(batch, frame, dropped, [], [], {})
        rows = plan_rows(frame, self.extractor, self.cfg.run.max_item_chars)
        keys = attach_keys(rows, self.prefix, self.per_row, self.cfg.judge.verdict_only)
        found = self.memo.get_many(keys) if self.memo is not None and keys else {}
        return PlannedChunk(batch, frame, dropped, rows, keys, found)

    def planned(
        self,
        info: SourceInfo,
        *,
        skip: Collection[str] = (),
        only_files: Collection[int] | None = None,
    ) -> Iterator[PlannedChunk]:
        """Every batch of the input, planned, in order."""
        for batch in self.batches(info, skip=skip, only_files=only_files):
            yield self.plan(batch)

    def next_planned(self, batches: Iterator[SourceChunk]) -> PlannedChunk | None:
        """Read the next batch and plan it (one worker-thread hop for both); None at the end."""
        batch = next(batches, None)
        return None if batch is None else self.plan(batch)
