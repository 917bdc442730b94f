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
output_tokens]`), read back as untrusted data (anyone who can write the memo folder can write a
journal): each line is bounded (`_MAX_LINE`) and checked field by field; a line that is not a
record (a torn tail, anything planted) is skipped and counted (`Replay.skipped`), never an error.
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
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from ctxprec.storage.files.layout import (
    JOURNAL_NEW,
    JOURNAL_SUFFIX,
    journal_dir,
    journal_file,
    journal_new,
)
from ctxprec.storage.memo.codec import MAX_REASON_BYTES, MAX_TOKENS
from ctxprec.storage.memo.store import MemoEntry

__all__ = ["Journal", "Replay", "open_journal", "replay_journals"]

_MAX_LINE = 1 << 20  # a longer line is not a record of ours: skipped
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


@dataclass
class Replay:
    """What a replay did: verdicts put into the memo, lines skipped (not records)."""

    replayed: int = 0
    skipped: int = 0


def replay_journals(memo_dir: Path, memo: _Sink) -> Replay:
    """Put the verdicts of the journals no live run holds into `memo`, then remove those
    journals. Blocking I/O: call it from a thread."""
    folder = journal_dir(memo_dir)
    done = Replay()
    if not folder.is_dir():
        return done
    for path in sorted(folder.iterdir()):
        if not (path.name.endswith(JOURNAL_SUFFIX) or path.name.startswith(JOURNAL_NEW)):
            continue
        with contextlib.suppress(OSError):
            _replay_one(path, memo, done)
    return done


def _replay_one(path: Path, memo: _Sink, done: Replay) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return  # not a file of ours: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its run is alive
        with os.fdopen(os.dup(fd), "rb") as lines:
            for chunk in _chunks(_records(lines, done)):
                done.replayed += memo.set_many(chunk)
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _chunks(records: Iterator[tuple[str, MemoEntry]]) -> Iterator[list[tuple[str, MemoEntry]]]:
    while chunk := list(itertools.islice(records, _REPLAY_CHUNK)):
        yield chunk


def _lines(lines: BinaryIO, done: Replay) -> Iterator[bytes]:
    """The file's lines of at most `_MAX_LINE` bytes; a longer one is read past (in bounded
    pieces) and counted as skipped."""
    while line := lines.readline(_MAX_LINE):
        if line.endswith(b"\n"):
            yield line
            continue
        if len(line) < _MAX_LINE:
            return  # the torn tail of a write a kill cut short: where the journal ends
        done.skipped += 1
        while (more := lines.readline(_MAX_LINE)) and not more.endswith(b"\n"):
            pass


def _records(lines: BinaryIO, done: Replay) -> Iterator[tuple[str, MemoEntry]]:
    """The records of a journal; a line that is not one is skipped and counted."""
    for line in _lines(lines, done):
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):
            raw = None
        if not _is_record(raw):
            done.skipped += 1
            continue
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
        and len(reason) <= MAX_REASON_BYTES
        and all(type(n) is int and 0 <= n <= MAX_TOKENS for n in (tokens_in, tokens_out))
    )
