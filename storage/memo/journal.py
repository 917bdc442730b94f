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

The journal folder is reached as a memo folder's entries are (`ctxprec.storage.memo.database`):
opened once through no link (a `journal` that is a link or a file refuses the memo folder), and
every file in it opened, renamed and removed relative to that open folder, so a link swapped in
meanwhile leads nowhere. Only names of ctxprec's own pattern (`layout.is_journal_name`) are read
or removed, and a journal is removed only while its name still holds the file that was replayed.
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
    is_journal_name,
    journal_dir,
    journal_name,
    journal_new_name,
)
from ctxprec.storage.memo.codec import MAX_REASON_BYTES, MAX_TOKENS
from ctxprec.storage.memo.database import NO_MEMO_WAY_OUT, entry_problem, refused
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

    def __init__(self, path: Path, fd: int, folder_fd: int) -> None:
        self.path = path
        self._fd = fd
        self._folder_fd = folder_fd  # the journal folder, as opened (through no link)

    def append(self, keys: Iterable[str], entries: Iterable[MemoEntry]) -> None:
        """One call's verdicts, written before the worker goes on (one system call)."""
        lines = [_dumps([k, e[0], e[1], e[2], e[3]]) for k, e in zip(keys, entries, strict=True)]
        with contextlib.suppress(OSError):  # a full disk: the memo writer still has them
            os.write(self._fd, ("\n".join(lines) + "\n").encode())

    def close(self, *, done: bool) -> None:
        """`done`: every verdict appended is in the memo, so the journal goes; otherwise it stays
        (unlocked) for the next run to replay."""
        try:
            if done:
                _remove_same(self._folder_fd, self.path.name, os.fstat(self._fd))
        finally:
            os.close(self._fd)  # releases the lock
            os.close(self._folder_fd)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_folder(memo_dir: Path, *, create: bool) -> int | None:
    """The journal folder of `memo_dir`, opened through no link (made first when `create`);
    None when there is none. A `journal` that is a link or a file refuses the memo folder
    (OutputError): nothing in it is read, written or removed."""
    folder = journal_dir(memo_dir)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder)  # (never through a link: an existing name is kept as it is)
    try:
        return os.open(folder, _FOLDER_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:
        problem = entry_problem(folder)
        if problem is not None:
            raise refused(memo_dir, problem, NO_MEMO_WAY_OUT) from None
        raise


def open_journal(memo_dir: Path) -> Journal | None:
    """A new journal in `memo_dir`, locked by this process; None where it cannot be written (a
    read-only memo folder: verdicts then reach the memo by its writer only)."""
    token = secrets.token_hex(8)
    new, name = journal_new_name(token), journal_name(token)
    try:
        folder_fd = _open_folder(memo_dir, create=True)
    except OSError:  # cannot be made or opened (a read-only folder): no journal
        return None
    if folder_fd is None:
        return None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
    try:
        fd = os.open(new, flags, 0o600, dir_fd=folder_fd)
    except OSError:
        os.close(folder_fd)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # visible to replayers only once locked
        os.rename(new, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(new, dir_fd=folder_fd)
        os.close(folder_fd)
        return None
    return Journal(journal_dir(memo_dir) / name, fd, folder_fd)


@dataclass
class Replay:
    """What a replay did: verdicts put into the memo, lines skipped (not records)."""

    replayed: int = 0
    skipped: int = 0


def replay_journals(memo_dir: Path, memo: _Sink) -> Replay:
    """Put the verdicts of the journals no live run holds into `memo`, then remove those
    journals. Blocking I/O: call it from a thread."""
    done = Replay()
    folder_fd = _open_folder(memo_dir, create=False)
    if folder_fd is None:
        return done
    try:
        with os.scandir(folder_fd) as entries:
            names = sorted(e.name for e in entries if is_journal_name(e.name))
        for name in names:
            with contextlib.suppress(OSError):
                _replay_one(folder_fd, name, memo, done)
    finally:
        os.close(folder_fd)
    return done


def _replay_one(folder_fd: int, name: str, memo: _Sink, done: Replay) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return  # not a file of ours: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its run is alive
        with os.fdopen(os.dup(fd), "rb") as lines:
            for chunk in _chunks(_records(lines, done)):
                done.replayed += memo.set_many(chunk)
        _remove_same(folder_fd, name, info)
    finally:
        os.close(fd)


def _remove_same(folder_fd: int, name: str, opened: os.stat_result) -> None:
    """Remove `name` from the journal folder if it still is the file `opened` (a file swapped
    in under its name meanwhile is left alone)."""
    with contextlib.suppress(OSError):
        now = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            os.unlink(name, dir_fd=folder_fd)


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
