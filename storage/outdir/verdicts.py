"""The shared verdict store: verdicts appended as Arrow IPC files under OUTDIR/_ctxprec/verdicts,
one folder per input file, so any machine that sees OUTDIR reuses every verdict paid for there
(diskcache is one host's memo). Files appear by rename (one PUT in an object store): a killed
writer leaves no torn file.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import atomic_write
from ctxprec.storage.files.confine import is_regular
from ctxprec.storage.files.objpath import OutPath, readable
from ctxprec.storage.memo.store import MemoEntry, MemoStore

__all__ = ["FLUSH_S", "SharedMemo", "VerdictStore", "open_shared", "verdict_dir"]

FLUSH_S = 1.0  # a killed worker loses at most this much of its newest verdicts
FILE_CAP = 256 << 20  # a verdict file is a second of verdicts; a larger one is not ours
_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("relevant", pa.bool_()),
        ("reason", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
    ]
)


def verdict_dir(outdir: OutPath, source: Path | str) -> OutPath:
    """The folder of the verdicts judged for one input file (named by its absolute path, or
    its object URI given as a string)."""
    name = str(source.resolve()) if isinstance(source, Path) else source
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return layout.verdict_dir(outdir, digest)


class VerdictStore:
    """Append-only verdict files in one folder; blocking I/O: call from a worker thread."""

    def __init__(
        self,
        directory: OutPath,
        *,
        flush_s: float = FLUSH_S,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "",
    ) -> None:
        self.directory = directory
        self._prefix = prefix  # of each file's name (the key-sharded store names its shard)
        self._flush_s = flush_s
        self._clock = clock
        self._buffer: list[tuple[str, MemoEntry]] = []
        self._last_flush = clock()
        self.files_written = 0

    def read(self) -> list[tuple[str, MemoEntry]]:
        """Every verdict in the folder (files other writers may still be adding to it)."""
        found: list[tuple[str, MemoEntry]] = []
        if not self.directory.is_dir():
            return found
        files: list[OutPath] = list(self.directory.glob("*.arrow"))
        for path in sorted(files, key=str):
            found.extend(self.read_file(path))
        return found

    @staticmethod
    def read_file(path: OutPath) -> list[tuple[str, MemoEntry]]:
        """The verdicts of one file; none if it is not a regular file (a link is not
        followed), is larger than FILE_CAP, cannot be read or is not of the verdicts'
        schema: those verdicts are judged again, never made up."""
        if not is_regular(path) or path.stat().st_size > FILE_CAP:
            return []
        try:
            with ipc.open_file(readable(path)) as reader:
                if not reader.schema.equals(_SCHEMA):
                    return []
                table = reader.read_all()
        except (OSError, pa.ArrowException):
            return []
        columns = [table.column(name).to_pylist() for name in _SCHEMA.names]
        if any(v is None for i in (0, 1, 3, 4) for v in columns[i]):
            return []  # a verdict without its key, its answer or its tokens
        return [
            (key, (rel, reason, tokens_in, tokens_out))
            for key, rel, reason, tokens_in, tokens_out in zip(*columns, strict=True)
        ]

    def append(self, entries: Iterable[tuple[str, MemoEntry]]) -> None:
        """Buffer verdicts; write them out once `flush_s` passed since the last write."""
        self._buffer.extend(entries)
        if self._buffer and self._clock() - self._last_flush >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = self._clock()
        if not self._buffer:
            return
        rows = self._buffer  # kept until written: a failed write (full disk) loses nothing
        keys, entries = zip(*rows, strict=True)
        columns = [list(keys), *(list(col) for col in zip(*entries, strict=True))]
        table = pa.Table.from_arrays(
            [pa.array(col, f.type) for col, f in zip(columns, _SCHEMA, strict=True)],
            schema=_SCHEMA,
        )
        target = layout.verdict_file(self.directory, f"{self._prefix}{uuid.uuid4().hex}")
        atomic_write(target, partial(_write_ipc, table))
        self._buffer = []
        self.files_written += 1


def _write_ipc(table: pa.Table, path: Path) -> None:
    with ipc.new_file(path, _SCHEMA) as writer:
        writer.write_table(table)


def open_shared(local: MemoStore | None, outdir: OutPath, source: str) -> MemoStore | None:
    """The local memo joined with OUTDIR's verdict store for `source` (None: memo off)."""
    if local is None:
        return None
    return SharedMemo(local, VerdictStore(verdict_dir(outdir, source)))


class SharedMemo:
    """The local memo, seeded from the verdict store when opened; new verdicts go to both."""

    def __init__(self, local: MemoStore, store: VerdictStore) -> None:
        self.local = local
        self.store = store
        self.imported = local.set_many(store.read())

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        return self.local.get_many(keys)

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        rows = list(entries)
        self.store.append(rows)
        return self.local.set_many(rows)

    def close(self) -> None:
        try:
            self.store.flush()
        finally:
            self.local.close()
