"""Opening a memo folder's database (diskcache 5's `Cache` table in `cache.db`) without trusting
it: its shape is checked, a folder ctxprec cannot write is opened read-only, and diskcache itself
only ever creates a database, never opens one (diskcache runs the PRAGMAs its `Settings` table
names and decodes values by the `mode` each row claims).

The memo folder itself, as the command line or config names it, is trusted (links above it
too); what is inside it is data anyone who can write there may have planted. So before anything
is opened, every entry ctxprec uses in it (`cache.db` and SQLite's files beside it, the open
lock, the journal folder) must be of its kind and not a symbolic link (`check_folder`), and a
clear removes only diskcache's value files, reached through no link."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files.kinds import LINK, kind_problem
from ctxprec.storage.files.layout import journal_dir, memo_db
from ctxprec.storage.memo.codec import HEADER_COLUMNS, HEADER_SIZE, MAGIC

OPEN_LOCK: Final = "ctxprec-open.lock"  # taken while a process opens (or creates) the memo

__all__ = [
    "CACHE_COLUMNS",
    "MODE_RAW",
    "NO_MEMO_WAY_OUT",
    "OpenedDb",
    "Tally",
    "check_folder",
    "clear_rows",
    "connect_reader",
    "entry_problem",
    "is_read_only_error",
    "open_db",
    "refused",
    "table_stats",
    "tally_rows",
    "write_failed",
]

# diskcache 5 (`diskcache.core.Cache.__init__`); pyproject pins diskcache to major version 5
CACHE_COLUMNS: Final = (
    "rowid", "key", "raw", "store_time", "expire_time", "access_time", "access_count", "tag",
    "size", "mode", "filename", "value",
)  # fmt: skip
MODE_RAW: Final = 1  # diskcache.core.MODE_RAW: the value column holds the value's bytes as they are
NO_MEMO_WAY_OUT: Final = "give another folder with --cache-dir, or run with --no-memo"
_CACHE_SIZE: Final = 2**13  # pages (diskcache's default sqlite_cache_size)
_MMAP_SIZE: Final = 2**26  # bytes (diskcache's default sqlite_mmap_size)


@dataclass
class OpenedDb:
    """The memo's writer connection (a read-only one when `read_only`), the target its readers
    open (`connect_reader`), or no database at all (`con` None: an empty, read-only memo)."""

    con: sqlite3.Connection | None
    target: str
    uri: bool
    read_only: bool


def write_failed(directory: Path, exc: BaseException) -> OutputError:
    reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return OutputError(
            f"cannot make the memo folder {directory}: {reason}; give a folder that can be "
            "made with --cache-dir, or run with --no-memo"
        )
    return OutputError(
        f"cannot write the memo in {directory}: {reason}; the verdicts of this batch are not "
        "kept there: free some space (or give a writable --cache-dir) and run the same command "
        "again to finish"
    )


def is_read_only_error(exc: BaseException) -> bool:
    """SQLite's "attempt to write a readonly database" (a read-only mount, a file of another
    user), or the OS's read-only file system."""
    if isinstance(exc, OSError):
        return exc.errno in (30, 13, 1)  # EROFS, EACCES, EPERM
    code = getattr(exc, "sqlite_errorcode", None)
    return (isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_READONLY) or (
        "readonly" in str(exc)
    )


def connect_reader(target: str, uri: bool) -> sqlite3.Connection:
    con = sqlite3.connect(
        target,
        uri=uri,
        timeout=60,
        isolation_level=None,
        check_same_thread=False,  # taken from the memo's pool by one thread at a time
    )
    try:
        con.execute(f"PRAGMA cache_size = {_CACHE_SIZE}")
        con.execute(f"PRAGMA mmap_size = {_MMAP_SIZE}")
    except BaseException:
        con.close()  # (a damaged file: closed now, not when it is collected)
        raise
    return con


def open_db(directory: Path, way_out: str = NO_MEMO_WAY_OUT) -> OpenedDb:
    """The memo database of `directory`, created (by diskcache) when there is none and the folder
    can be written; read-only when it cannot. A database that is not diskcache 5's table is
    refused (OutputError naming `way_out`)."""
    check_folder(directory, way_out)
    with _opening(directory):
        return _open_db(directory, way_out)


def entry_problem(path: Path, folder: bool = False) -> str | None:
    """What is wrong with an entry of a memo folder ctxprec uses (None: missing, or a regular
    file, or with `folder` a real folder), in words naming it."""
    what = kind_problem(path, folder)
    if what == LINK:
        return (
            f"{path.name} is a symbolic link (ctxprec reads, writes and removes nothing through "
            "a link in a memo folder: it may lead outside it; remove the link, its target is "
            "untouched)"
        )
    if what is None or what.startswith("cannot"):
        return what and f"{path.name} {what}"
    if folder:
        return f"{path.name} is a file, not the folder ctxprec keeps its journals in"
    return f"{path.name} is {what}, not a file ctxprec wrote"


def check_folder(directory: Path, way_out: str = NO_MEMO_WAY_OUT) -> None:
    """Every entry ctxprec opens in the memo folder `directory` (the database and SQLite's files
    beside it, the open lock, the journal folder) is missing or of its kind, through no link;
    otherwise the folder is refused (OutputError naming the entry and `way_out`) before
    anything in it is opened."""
    entries = [(p, False) for p in (*_db_files(memo_db(directory)), directory / OPEN_LOCK)]
    entries.append((journal_dir(directory), True))
    for path, folder in entries:
        if (problem := entry_problem(path, folder)) is not None:
            raise refused(directory, problem, way_out)


@contextlib.contextmanager
def _opening(directory: Path) -> Iterator[None]:
    """Processes opening one memo folder at once (a Dask worker per core, two runs) take turns,
    so none reads a cache.db that diskcache is still creating for another. A folder that cannot
    be written takes no lock (nothing is created there)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(directory / OPEN_LOCK, flags, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open_db(directory: Path, way_out: str) -> OpenedDb:
    db = memo_db(directory)
    created = False
    beside = [p for p in _db_files(db)[1:] if not os.path.lexists(p)]
    if not os.path.lexists(db):
        if not _create(directory):
            return OpenedDb(None, "", False, True)
        created = True
    elif _blank(db):
        # another process (a Dask worker, a second run) is creating it right now, or it is an
        # empty file: diskcache creates only the tables that are missing, so finishing it is safe
        _create(directory, ours=False)
    try:
        return _open_existing(directory, db, way_out)
    except OutputError:
        if not created:
            _remove_new(db, beside)  # SQLite's files the refused open made: none is left
            raise
        _remove_new(db)  # diskcache could not finish the new database: the next open starts afresh
        why = OSError("the new memo database could not be written completely")
        raise write_failed(directory, why) from None


def _open_existing(directory: Path, db: Path, way_out: str) -> OpenedDb:
    for path in _db_files(db):  # checked again: diskcache may have made them meanwhile
        if (problem := entry_problem(path)) is not None:
            raise refused(directory, problem, way_out)
    if all(os.access(p, os.W_OK) for p in (directory, *_db_files(db)) if os.path.lexists(p)):
        con: sqlite3.Connection | None = None
        try:
            con = connect_reader(str(db), False)
            con.execute("PRAGMA synchronous = 1")  # diskcache's default: NORMAL
            _check_shape(con, directory, way_out)
            return OpenedDb(con, str(db), False, False)
        except sqlite3.OperationalError as exc:
            if con is not None:
                con.close()
            if not is_read_only_error(exc):
                raise write_failed(directory, exc) from exc
        except sqlite3.DatabaseError as exc:
            if con is not None:
                con.close()
            why = f"{db.name} is not an SQLite database ({exc})"
            raise refused(directory, why, way_out) from exc
    return _open_read_only(directory, db, way_out)


def _blank(db: Path) -> bool:
    """An SQLite file with no table in it yet (or an empty file), not through a link."""
    if db.is_symlink() or not db.is_file():
        return False
    if db.stat().st_size == 0:
        return True
    try:
        con = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=60)
        try:
            (tables,) = con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False  # not a database, or unreadable: the shape check says why
    return int(tables) == 0


def _db_files(db: Path) -> tuple[Path, ...]:
    """The database and the files SQLite keeps beside it (WAL, shared memory, rollback journal)."""
    return (db, *(db.with_name(db.name + end) for end in ("-wal", "-shm", "-journal")))


def _create(directory: Path, *, ours: bool = True) -> bool:
    """A new, empty memo database in `directory` (diskcache's own schema and settings); False
    when the folder cannot be written (then the memo is empty and read-only). `ours`: the
    database file is this call's to make, so one cut short is removed (else it is left)."""
    import diskcache

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if is_read_only_error(exc):
            return False
        raise write_failed(directory, exc) from exc
    if not os.access(directory, os.W_OK):
        return False
    try:
        diskcache.Cache(
            str(directory), eviction_policy="none", size_limit=2**62, cull_limit=0,
            statistics=False,
        ).close()  # fmt: skip
    except (OSError, sqlite3.Error) as exc:
        if ours:  # cut short (a full disk): the next open starts afresh
            _remove_new(memo_db(directory))
        if is_read_only_error(exc):
            return False
        raise write_failed(directory, exc) from exc
    return True


def _remove_new(db: Path, only: list[Path] | None = None) -> None:
    """Remove the database files this process made (`only`: those of them, else all), each
    only while it is a regular file (never through a link)."""
    for path in _db_files(db) if only is None else only:
        if entry_problem(path) is None:
            with contextlib.suppress(OSError):
                path.unlink()


def _open_read_only(directory: Path, db: Path, way_out: str) -> OpenedDb:
    """A read-only connection: `mode=ro`, else (a WAL database whose -shm file cannot be made in
    a read-only folder) `immutable=1`, which reads the file as it is, without locks."""
    base = db.absolute().as_uri()
    for query in ("?mode=ro", "?mode=ro&immutable=1"):
        try:
            con = connect_reader(base + query, True)
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:
            continue
        except sqlite3.DatabaseError as exc:
            why = f"{db.name} is not an SQLite database ({exc})"
            raise refused(directory, why, way_out) from exc
        _check_shape(con, directory, way_out)
        return OpenedDb(con, base + query, True, True)
    raise refused(directory, f"{db.name} cannot be opened, even read-only", way_out)


def _check_shape(con: sqlite3.Connection, directory: Path, way_out: str) -> None:
    try:
        problem = _shape_problem(con)
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:
        problem = f"is not an SQLite database ({exc})"
    if problem is not None:
        con.close()
        raise refused(directory, f"{memo_db(directory).name} {problem}", way_out)


def _shape_problem(con: sqlite3.Connection) -> str | None:
    tables = dict(
        con.execute("SELECT name, type FROM sqlite_master WHERE name IN ('Cache', 'Settings')")
    )
    if tables.get("Cache") != "table" or tables.get("Settings") != "table":
        return "holds no diskcache Cache and Settings tables"
    columns = tuple(name for (name,) in con.execute("SELECT name FROM pragma_table_info('Cache')"))
    if columns != CACHE_COLUMNS:
        return f"has a Cache table of other columns than diskcache 5's ({', '.join(columns)})"
    for name, unique, partial in con.execute(
        "SELECT name, \"unique\", partial FROM pragma_index_list('Cache')"
    ).fetchall():
        cols = [c for (c,) in con.execute("SELECT name FROM pragma_index_info(?)", (name,))]
        if unique and not partial and cols == ["key", "raw"]:
            return None
    return "has no unique index on Cache(key, raw), as diskcache 5 makes"


def refused(directory: Path, why: str, way_out: str = NO_MEMO_WAY_OUT) -> OutputError:
    """The memo folder `directory` refused, in one line saying why and the way out."""
    return OutputError(f"the memo folder {directory} cannot be used: {why}; {way_out}")


# diskcache 5's name for a value kept in a file of its own (`Disk.filename`): the only name a
# clear removes, and only below the memo folder through no symbolic link
_FILE_NAME: Final = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")


def table_stats(con: sqlite3.Connection) -> tuple[int, float | None, float | None]:
    """Rows of the memo's table and the oldest and newest store times (None: none readable)."""
    n, oldest, newest = con.execute(
        "SELECT count(*), min(store_time), max(store_time) FROM Cache"
        " WHERE typeof(store_time) IN ('real', 'integer')"
    ).fetchone()
    (total,) = con.execute("SELECT count(*) FROM Cache").fetchone()
    return int(total), (float(oldest) if n else None), (float(newest) if n else None)


def _where(cutoff: float | None, only: str | None) -> tuple[str, tuple[float, ...]]:
    """The WHERE clause (empty: every row) and its parameters of the rows stored before
    `cutoff` (None: any time) that `only` selects (an SQL condition; None: every row)."""
    tests = [] if cutoff is None else ["NOT (store_time >= ?)"]  # (unreadable times too)
    tests += [] if only is None else [f"({only})"]
    where = " WHERE " + " AND ".join(tests) if tests else ""
    return where, (() if cutoff is None else (cutoff,))


@dataclass(frozen=True, slots=True)
class Tally:
    """What some of the memo's rows hold: how many, their bytes (keys and values), and the
    tokens their verdicts took (the headers of the values that are verdicts)."""

    rows: int
    size: int
    input_tokens: int
    output_tokens: int


def tally_rows(con: sqlite3.Connection, cutoff: float | None, only: str | None = None) -> Tally:
    """The rows `clear_rows` would delete with the same arguments, counted (only their
    headers are read, a batch at a time)."""
    where, params = _where(cutoff, only)
    n, size = con.execute(
        "SELECT count(*), coalesce(sum(coalesce(length(key), 0) + coalesce(length(value), 0)), 0)"
        " FROM Cache" + where,
        params,
    ).fetchone()
    heads = con.execute(
        f"SELECT substr(value, 1, {HEADER_SIZE}) FROM Cache"
        + (where or " WHERE 1")
        + " AND typeof(value) = 'blob'",
        params,
    )
    t_in = t_out = 0
    while batch := heads.fetchmany(_TALLY_BATCH):
        for (head,) in batch:
            if len(head) == HEADER_SIZE and head.startswith(MAGIC):
                _, _, tokens_in, tokens_out = HEADER_COLUMNS.unpack(head)
                t_in, t_out = t_in + tokens_in, t_out + tokens_out
    return Tally(int(n), int(size), t_in, t_out)


_TALLY_BATCH: Final = 65_536


def clear_rows(
    con: sqlite3.Connection, directory: Path, cutoff: float | None, only: str | None = None
) -> int:
    """Delete the rows stored before `cutoff` (None: all), and only those `only` selects (an
    SQL condition: None, every row), in one transaction, then the files diskcache kept for them
    (`_FILE_NAME` only, resolved inside `directory`); rows deleted."""
    where, params = _where(cutoff, only)
    con.execute("BEGIN IMMEDIATE")
    try:
        files = [
            name
            for (name,) in con.execute(
                "SELECT filename FROM Cache" + (where or " WHERE 1") + " AND filename IS NOT NULL",
                params,
            )
        ]
        removed = con.execute("DELETE FROM Cache" + where, params).rowcount
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    for name in files:
        _remove_value_file(directory, name)
    return int(removed)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _remove_value_file(directory: Path, name: object) -> None:
    """Remove diskcache's value file `name` (`_FILE_NAME` only): its two folders are opened
    through no link, one below the other, and the file is removed relative to the second (a
    link itself, never what it points to); the folders go once empty."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
        return  # not a name diskcache gives: not ours to remove
    first, second, leaf = name.split("/")
    opened: list[int] = []
    try:
        opened.append(os.open(directory / first, _FOLDER_FLAGS))
        opened.append(os.open(second, _FOLDER_FLAGS, dir_fd=opened[0]))
        os.unlink(leaf, dir_fd=opened[1])
        os.rmdir(second, dir_fd=opened[0])
        os.rmdir(directory / first)
    except OSError:
        pass  # a link on the way, gone already, or a folder still in use: left as it is
    finally:
        for fd in opened:
            os.close(fd)
