"""The verdict journal: each paid judge call's verdict appended to a file of the memo folder the
moment the call completes, before its worker takes the next call. The memo's own writer commits
verdicts in groups (one SQLite transaction for all that finished meanwhile), so until a group is
written its verdicts live only in memory; a process killed then (`kill -9`, the OOM killer) would
lose them and the next run would pay for them again. An append to a file the OS holds survives
the kill of the process (not a power loss: the journal is not fsynced), so a kill repeats at most
the calls that were in flight.

One journal per run: `<memo folder>/journal/<token>.jsonl`, locked (flock) by its run for its
life and removed when the run ends with every verdict in the memo. A journal nobody holds was
left by a killed run: the next run that opens the memo folder replays it into the memo, then
removes it. Records are JSON lines of fixed fields (`[key, relevant, reason, input_tokens,
output_tokens]`), read back as data: a line that is not one is where the journal ends (a kill
cuts at most its last line).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from storage.layout import JOURNAL_NEW, JOURNAL_SUFFIX, journal_dir, journal_file, journal_new
from storage.memo import MemoEntry

__all__ = ["Journal", "open_journal", "replay_journals"]

_MAX_LINE = 1 << 20  # a longer line is not a record of ours: the journal ends there
_MAX_KEY = 200
_REPLAY_CHUNK = 50_000  # verdicts per memo write of a replay (bounded memory)
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


class _Sink(Protocol):
    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int: ...


class Journal:
    """This run's journal, open for appends; `append` is one `os.write`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def append(self, keys: Iterable[str], entries: Iterable[MemoEntry]) -> None:
        """One call's verdicts, written before the worker goes on (one system call)."""
        lines = [_dumps([k, e[0], e[1], e[2], e[3]]) for k, e in zip(keys, entries, strict=True)]
        with contextlib.suppress(OSError):  # a full disk: the memo writer still has them
            os.write(self._fd, ("\n".join(lines) + "\n").encode())

    def close(self, *, done: bool) -> None:
        """`done`: every verdict appended is in the memo, so the journal goes; otherwise it stays
        (unlocked) for the next run to replay."""
        if done:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)  # releases the lock


def open_journal(memo_dir: Path) -> Journal | None:
    """A new journal in `memo_dir`, locked by this process; None where it cannot be written (a
    read-only memo folder: verdicts then reach the memo by its writer only)."""
    folder = journal_dir(memo_dir)
    token = secrets.token_hex(8)
    tmp = journal_new(memo_dir, token)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = journal_file(memo_dir, token)
        os.rename(tmp, path)  # visible to replayers only once locked
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return Journal(path, fd)


def replay_journals(memo_dir: Path, memo: _Sink) -> int:
    """Put the verdicts of the journals no live run holds into `memo`, then remove those
    journals; the number of verdicts replayed. Blocking I/O: call it from a thread."""
    folder = journal_dir(memo_dir)
    if not folder.is_dir():
        return 0
    replayed = 0
    for path in sorted(folder.iterdir()):
        if not (path.name.endswith(JOURNAL_SUFFIX) or path.name.startswith(JOURNAL_NEW)):
            continue
        with contextlib.suppress(OSError):
            replayed += _replay_one(path, memo)
    return replayed


def _replay_one(path: Path, memo: _Sink) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0  # not a file of ours: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # its run is alive
        replayed = 0
        with os.fdopen(os.dup(fd), "rb") as lines:
            for chunk in _chunks(_records(lines)):
                replayed += memo.set_many(chunk)
        path.unlink(missing_ok=True)
        return replayed
    finally:
        os.close(fd)


def _chunks(records: Iterator[tuple[str, MemoEntry]]) -> Iterator[list[tuple[str, MemoEntry]]]:
    while chunk := list(itertools.islice(records, _REPLAY_CHUNK)):
        yield chunk


def _records(lines: BinaryIO) -> Iterator[tuple[str, MemoEntry]]:
    """The records up to the first line that is not one (a torn tail, or anything planted)."""
    while line := lines.readline(_MAX_LINE):
        if not line.endswith(b"\n"):
            return
        try:
            raw = json.loads(line)
        except ValueError:
            return
        if not _is_record(raw):
            return
        key, relevant, reason, tokens_in, tokens_out = raw
        yield key, (relevant, reason, tokens_in, tokens_out)


def _is_record(raw: object) -> bool:
    if not (isinstance(raw, list) and len(raw) == 5):
        return False
    key, relevant, reason, tokens_in, tokens_out = raw
    return (
        isinstance(key, str)
        and 0 < len(key) <= _MAX_KEY
        and key.isascii()
        and key.isprintable()
        and type(relevant) is bool
        and isinstance(reason, str)
        and all(type(n) is int and n >= 0 for n in (tokens_in, tokens_out))
    )
