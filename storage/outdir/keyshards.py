"""Judge keys sharded by hash, for a cluster run that judges each distinct key once.

A run's scratch folder (`OUTDIR/_ctxprec/shuffle/<run>/`) holds, for each (task, shard), the
distinct requests the task's rows need (`keys/s<shard>/t<task>-<part>.arrow`) and, once the shard is
judged, the answers the task's reduce reads (`answers/t<task>/s<shard>.arrow`). The verdicts
themselves go to `OUTDIR/_ctxprec/verdicts/keys/`, files named `<shards>-<shard>-<uuid>.arrow`,
so a later run with any power-of-two shard count reads only the files that can hold its keys.
All files are Arrow IPC written by rename (one PUT in an object store); file names are fixed
per (task, shard), so a retried task overwrites its own files and never adds a second copy.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import atomic_write
from ctxprec.storage.files.objpath import OutPath, readable
from ctxprec.storage.memo.store import MemoEntry
from ctxprec.storage.outdir.verdicts import VerdictStore

__all__ = [
    "Answer",
    "Request",
    "ShardedVerdicts",
    "read_answers",
    "read_requests",
    "remove_tree",
    "request_files",
    "shard_count",
    "shard_of",
    "shuffle_dir",
    "write_answers",
    "write_requests",
]

MAX_SHARDS = 4096

# (key, query, expected, item): one distinct judge request
Request = tuple[str, str, str | None, str]
# (key, entry or None, judged in this run, error of a failed call or None)
Answer = tuple[str, MemoEntry | None, bool, str | None]

_REQUESTS = pa.schema(
    [("key", pa.string()), ("query", pa.string()), ("expected", pa.string()), ("item", pa.string())]
)
_ANSWERS = pa.schema(
    [
        ("key", pa.string()),
        ("relevant", pa.bool_()),
        ("reason", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("fresh", pa.bool_()),
        ("error", pa.string()),
    ]
)
_NAME = re.compile(r"^(\d+)-(\d+)-[0-9a-f]+\.arrow$")


def shard_count(rows: int, rows_per_shard: int, at_least: int) -> int:
    """A power of two: about `rows_per_shard` input rows a shard, at least `at_least` shards."""
    want = max(at_least, -(-rows // max(rows_per_shard, 1)), 1)
    return min(MAX_SHARDS, 1 << (want - 1).bit_length())


def shard_of(key: str, shards: int) -> int:
    """The shard of a memo key (`v1-<sha256 hex>`): its last 32 bits modulo a power of two."""
    return int(key[-8:], 16) & (shards - 1)


def shuffle_dir(outdir: OutPath, run: str) -> OutPath:
    return layout.shuffle_dir(outdir, run)


def request_files(scratch: OutPath, shard: int) -> list[OutPath]:
    """The request files of one shard, in task order."""
    folder = layout.shuffle_requests(scratch, shard)
    if not folder.is_dir():
        return []
    found: list[OutPath] = list(folder.glob("t*.arrow"))
    return sorted(found, key=lambda p: p.name)


def task_of(path: OutPath) -> int:
    """The task of a request file `t<task>-<part>.arrow`."""
    return int(path.name[1:].split("-", 1)[0])


def _write(target: OutPath, table: pa.Table) -> None:
    atomic_write(target, partial(_write_ipc, table))


def _write_ipc(table: pa.Table, path: Path) -> None:
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)


def _read(path: OutPath) -> pa.Table:
    with ipc.open_file(readable(path)) as reader:
        return reader.read_all()


def write_requests(
    scratch: OutPath, task: int, shards: int, requests: Iterable[Request], part: int = 0
) -> int:
    """Write one part of a task's distinct requests, one file per shard that has any (a task
    numbers its parts the same way on a retry, so a retry overwrites them). Returns the files."""
    by_shard: list[list[Request]] = [[] for _ in range(shards)]
    for request in requests:
        by_shard[shard_of(request[0], shards)].append(request)
    written = 0
    for shard, rows in enumerate(by_shard):
        if not rows:
            continue
        columns = [list(col) for col in zip(*rows, strict=True)]
        table = pa.Table.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, _REQUESTS, strict=True)],
            schema=_REQUESTS,
        )
        _write(layout.shuffle_request_file(scratch, shard, task, part), table)
        written += 1
    return written


def read_requests(path: OutPath) -> Iterator[Request]:
    table = _read(path)
    columns = [table.column(name).to_pylist() for name in _REQUESTS.names]
    yield from zip(*columns, strict=True)


def write_answers(scratch: OutPath, task: int, shard: int, answers: Sequence[Answer]) -> None:
    keys, relevant, reason, t_in, t_out, fresh, error = [], [], [], [], [], [], []
    for key, entry, is_fresh, err in answers:
        keys.append(key)
        fresh.append(is_fresh)
        error.append(err)
        rel, why, a, b = entry if entry is not None else (None, None, None, None)
        relevant.append(rel)
        reason.append(why)
        t_in.append(a)
        t_out.append(b)
    columns = [keys, relevant, reason, t_in, t_out, fresh, error]
    table = pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, _ANSWERS, strict=True)], schema=_ANSWERS
    )
    _write(layout.shuffle_answer_file(scratch, task, shard), table)


def read_answers(scratch: OutPath, task: int) -> Iterator[Answer]:
    folder = layout.shuffle_answers(scratch, task)
    if not folder.is_dir():
        return
    files: list[OutPath] = list(folder.glob("s*.arrow"))
    for path in sorted(files, key=str):
        table = _read(path)
        columns = [table.column(name).to_pylist() for name in _ANSWERS.names]
        for key, rel, why, a, b, fresh, err in zip(*columns, strict=True):
            entry: MemoEntry | None = None if err is not None else (rel, why, a, b)
            yield key, entry, bool(fresh), err


def remove_tree(folder: OutPath) -> None:
    """Remove a scratch folder and everything below it (local or object store)."""
    if isinstance(folder, Path):
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in list(folder.rglob("*")):
        path.unlink(missing_ok=True)


@dataclass
class ShardedVerdicts:
    """The run's verdicts by shard: `OUTDIR/_ctxprec/verdicts/keys/<shards>-<shard>-*.arrow`."""

    directory: OutPath

    @classmethod
    def of(cls, outdir: OutPath) -> ShardedVerdicts:
        return cls(layout.key_shards(outdir))

    def read(self, shard: int, shards: int) -> dict[str, MemoEntry]:
        """Every stored verdict of this shard. A file written under another shard count is read
        when its keys can belong here (powers of two: the shards agree modulo the smaller)."""
        found: dict[str, MemoEntry] = {}
        if not self.directory.is_dir():
            return found
        for path in self.directory.glob("*.arrow"):
            match = _NAME.match(path.name)
            if match is None:
                continue
            theirs, their_shard = int(match[1]), int(match[2])
            common = min(theirs, shards)
            if their_shard % common != shard % common:
                continue
            same = theirs == shards
            for key, entry in VerdictStore.read_file(path):
                if same or shard_of(key, shards) == shard:
                    found[key] = entry
        return found

    def writer(self, shard: int, shards: int, flush_s: float) -> VerdictStore:
        """An appender whose files say which shard they hold (`shards`=1: any key)."""
        return VerdictStore(self.directory, flush_s=flush_s, prefix=f"{shards}-{shard}-")
