"""On-disk verdict memo (diskcache 5's table) and its key recipe.

A key is a tagged SHA-256 over everything that changes a verdict: the judge's identity
(provider, model, base URL, decoding), the prompt version, query, expected output and item.
Entries are never evicted: a verdict once paid for stays. A value is read by a fixed layout
(`ctxprec.storage.memo.codec`), never unpickled: a memo folder is untrusted data.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, islice
from pathlib import Path
from typing import Any, Final, Protocol

import platformdirs

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.memo.codec import (
    HEADER_SIZE,
    MAX_VALUE_BYTES,
    MemoEntry,
    decode_columns,
    decode_entry,
    encode_entry,
    entry_of,
)
from ctxprec.storage.memo.database import (
    MODE_RAW,
    NO_MEMO_WAY_OUT,
    Tally,
    clear_rows,
    connect_reader,
    is_read_only_error,
    open_db,
    table_stats,
    tally_rows,
    write_failed,
)

__all__ = [
    "INPUT_TOKENS",
    "KEY_TAG",
    "MEMO_RECIPE",
    "NO_MEMO_WAY_OUT",
    "OUTPUT_TOKENS",
    "REASON",
    "RELEVANT",
    "Memo",
    "MemoEntry",
    "MemoStore",
    "default_cache_dir",
    "entry_of",
    "item_keys",
    "judge_prefix",
    "memo_key",
    "row_hasher",
]

MEMO_RECIPE = "ctxprec-memo-v2"  # change when the recipe below (or the stored format) changes
# v2: verdicts stored in a fixed layout, not pickled; v1 entries are left unread (`Memo.notes`)
KEY_TAG = "v2-"

# a verdict's fields in a MemoEntry (ctxprec.storage.memo.codec): read them by these names, not by
# number
RELEVANT: Final = 0
REASON: Final = 1
INPUT_TOKENS: Final = 2
OUTPUT_TOKENS: Final = 3


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("ctxprec")) / "memo"


def judge_prefix(identity: Mapping[str, Any]) -> bytes:
    """Canonical JSON of the judge identity: the fixed part of every key of one run."""
    canonical = json.dumps(
        {"recipe": MEMO_RECIPE, "judge": identity}, sort_keys=True, separators=(",", ":")
    )
    return canonical.encode()


def _field(text: str | None) -> bytes:
    if text is None:
        return b"-"
    raw = text.encode("utf-8", "surrogatepass")
    return b"%d:" % len(raw) + raw  # length-prefixed: no two field lists share an encoding


def row_hasher(prefix: bytes, prompt_version: str, query: str, expected: str | None) -> Any:
    """The key recipe up to the item: hashed once per row, copied for each of its items."""
    h = hashlib.sha256(prefix)
    h.update(_field(prompt_version) + _field(query) + _field(expected))
    return h


def item_keys(row: Any, items: Iterable[str]) -> list[str]:
    """The memo keys of a row's items, from the row's `row_hasher` (the same keys as
    `memo_key`, without hashing the row's fields again for every item)."""
    keys = []
    for item in items:
        h = row.copy()
        raw = item.encode("utf-8", "surrogatepass")
        h.update(b"%d:%b" % (len(raw), raw))
        keys.append(KEY_TAG + h.hexdigest())
    return keys


def memo_key(
    prefix: bytes, prompt_version: str, query: str, expected: str | None, item: str
) -> str:
    return item_keys(row_hasher(prefix, prompt_version, query, expected), (item,))[0]


class MemoStore(Protocol):
    """What the flow needs of a memo (`Memo`, or an engine's memo that also shares verdicts);
    the methods block: call them from a worker thread."""

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]: ...

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int: ...

    def close(self) -> None: ...


# Batched access to diskcache 5's table (`Cache(rowid, key, raw, store_time, expire_time,
# access_time, access_count, tag, size, mode, filename, value)`, unique index on (key, raw),
# checked when the memo opens: `ctxprec.storage.memo.database`). String keys are stored as they are
# (raw = 1); a verdict is stored in the fixed layout of `ctxprec.storage.memo.codec`, as bytes in
# `value` (diskcache's raw mode: `Cache.get` returns those bytes). A row is read only when it is
# such a row (mode raw, no file, a BLOB of a verdict's length): a pickle, a file named by
# `filename` or any other row is never read, whatever its mode says; it is a miss, counted
# (`Memo.unreadable`), and the item is judged again. One query per chunk of keys replaces one
# query per key, and new keys go in with multi-row INSERTs; diskcache's own `get`/`set` are not
# used (they unpickle and open files as the row says).
#
# Each SQLite step releases the GIL and takes it back: a query returning one row per key, or an
# `executemany`, hands the GIL over once per row. While another thread runs Python (the judge,
# the rows of another batch) each hand-back waits for that thread's switch interval (5 ms): a
# convoy that made 100,000 inserts take 570 s instead of 2 s. So reads come back as one row per
# chunk and writes go in as one statement per chunk of rows: one step, one hand-over.
#
# The read's one row holds a flag per key ("0": not there, "1": a verdict's row, "2": another
# row), the verdicts' 21-byte headers back to back and their reasons joined by NUL (a reason
# holds none). SQL checks each row's shape (mode, no file, a BLOB of a verdict's length); the
# batch decodes and checks its headers (magic, flag, token counts) in C
# (`memo_codec.decode_columns`: no Python step per item on the warm path); a forged header or
# a reason that breaks the join (a NUL, bad UTF-8) sends the batch's keys to the row-by-row
# read, which decodes each value on its own (`decode_entry`) and counts those that are not.
_CHUNK = 900  # under SQLite's oldest limit of 999 bound parameters (the time is one more)
_SEP = "\x1f"  # between keys of the packed read (a key holding it takes the row-per-key read)
_WHERE = "raw = 1 AND key IN ({}) AND (expire_time IS NULL OR expire_time > ?)"
_SELECT = "SELECT key, mode, filename, value FROM Cache WHERE " + _WHERE


def _verdict_row(c: str) -> str:
    """The SQL test of a verdict's row (`c`: the table's name in the query, with its dot): the
    row's shape only; its header's fields are checked in C over the whole batch
    (`memo_codec.decode_columns`), which is a quarter faster than `substr` tests here."""
    v = f"{c}value"
    return (
        f"{c}mode = {MODE_RAW} AND {c}filename IS NULL AND typeof({v}) = 'blob'"
        f" AND length({v}) BETWEEN {HEADER_SIZE} AND {MAX_VALUE_BYTES}"
    )


def _columns(c: str) -> str:
    """The flags, headers and reasons of the read (see above)."""
    ok = _verdict_row(c)
    missing = f"WHEN {c}rowid IS NULL THEN '0' " if c else ""  # (the LEFT JOIN's unmatched keys)
    return (
        f"group_concat(CASE {missing}WHEN {ok} THEN '1' ELSE '2' END, ''),"
        f" CAST(group_concat(CASE WHEN {ok} THEN substr({c}value, 1, {HEADER_SIZE}) END, '')"
        " AS BLOB),"
        f" CAST(group_concat(CASE WHEN {ok} THEN substr({c}value, {HEADER_SIZE + 1}) END,"
        " char(0)) AS BLOB)"
    )


_SELECT_PACKED = (
    "SELECT count(*), group_concat(key, char(31)), " + _columns("") + " FROM Cache WHERE " + _WHERE
)
# The read of a whole batch, with its keys as one JSON array: one statement, so the reading
# thread takes the GIL back once per batch instead of once per 900 keys. Its rows follow the
# array (a LEFT JOIN from json_each probes the index key by key, in the order asked: `get_many`
# asks in key order), so the keys need not come back. Where SQLite has no JSON functions, the
# IN (?, ?, ...) form above is used.
_SELECT_ORDERED = (
    "SELECT "
    + _columns("c.")
    + " FROM json_each(?) AS j LEFT JOIN Cache AS c ON c.key = j.value AND c.raw = 1"
    " AND (c.expire_time IS NULL OR c.expire_time > ?)"
)
_JSON_KEYS = 20_000  # keys per JSON read
_READERS = 2  # read connections at most (`Memo._take_reader`): the two batch planners
_EXISTING = "SELECT key FROM Cache WHERE raw = 1 AND key IN ({})"
_INSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size,"
    " mode, filename, value) VALUES "
)
_ROW = f"(?, 1, ?, NULL, ?, 0, NULL, 0, {MODE_RAW}, NULL, ?)"
_INSERT_ROWS = 999 // 4  # rows of 4 parameters in one INSERT
# a key stored already takes the new verdict in place; a file its row named is left alone
# (never removed: the row's `filename` is not trusted)
_UPDATE = (
    "UPDATE Cache SET store_time = ?1, expire_time = NULL, access_time = ?1, access_count = 0,"
    f" tag = NULL, size = 0, mode = {MODE_RAW}, filename = NULL, value = ?2"
    " WHERE key = ?3 AND raw = 1"
)
_STEP_ROWS = 50_000  # rows of one JSON INSERT (a bigger write is several: bounded memory)
# All new keys of a write in one step (SQLite's JSON functions): the keys and where each value
# lies in one BLOB of them all, as one JSON text of [key, offset, length] rows.
_INSERT_JSON = (
    "INSERT OR IGNORE INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) SELECT json_extract(j.value, '$[0]'), 1, ?1, NULL, ?1, 0,"
    f" NULL, 0, {MODE_RAW}, NULL, substr(?2, json_extract(j.value, '$[1]'),"
    " json_extract(j.value, '$[2]')) FROM json_each(?3) AS j"
)
# which of the keys were stored before the INSERT (a rowid below its first)
_STORED_JSON = (
    "SELECT json_group_array(c.key) FROM json_each(?) AS j CROSS JOIN Cache AS c"
    " ON c.key = j.value AND c.raw = 1 WHERE c.rowid < ?"
)
# entries of the key recipes before this one (v1: pickled values): never read, named once
_OLDER_ROWS = "raw = 1 AND key >= 'v1-' AND key < 'v1.'"
_OLDER = f"SELECT 1 FROM Cache WHERE {_OLDER_ROWS} LIMIT 1"


def _chunks(keys: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start : start + _CHUNK]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _slices(rows: dict[str, bytes], n: int) -> Iterable[dict[str, bytes]]:
    if len(rows) <= n:
        yield rows
        return
    items = iter(rows.items())
    while part := dict(islice(items, n)):
        yield part


def _has_json(con: sqlite3.Connection) -> bool:
    """Whether this SQLite has the JSON functions (built in since 3.38, an option before)."""
    try:
        con.execute("SELECT json_extract('[1]', '$[0]')").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


class Memo:
    """The on-disk memo: diskcache 5's table, read and written in batches by fixed-layout values
    (`ctxprec.storage.memo.codec`); call its methods from a worker thread. A folder it cannot write
    is used read-only (`read_only`: verdicts it holds are used, new ones are not kept); a database
    that is not diskcache 5's table is refused (OutputError naming `way_out`)."""

    def __init__(
        self,
        directory: Path,
        *,
        way_out: str = NO_MEMO_WAY_OUT,
        step_rows: int = _STEP_ROWS,
        json_sql: bool = True,
    ):
        """`step_rows` and `json_sql` are seams: the rows of one JSON INSERT, and whether to use
        SQLite's JSON functions where it has them (False: the IN (...) and multi-row forms an
        SQLite without them gets)."""
        self.directory = directory
        self.step_rows = step_rows  # rows of one JSON INSERT (a bigger write is several)
        opened = open_db(directory, way_out)
        self._con = opened.con
        self._target, self._uri = opened.target, opened.uri
        self.read_only = opened.read_only
        self.unreadable = 0  # entries found that were not verdicts (read as misses)
        self.not_kept = 0  # verdicts not stored (a read-only memo)
        self._counting = threading.Lock()
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._opened: list[sqlite3.Connection] = []
        self._opening = threading.Lock()
        self._writing = threading.Lock()  # one transaction at a time on the writer connection
        con = self._con
        self._json_writes = json_sql and con is not None and _has_json(con)
        self._json_reads = self._json_writes  # turned off too if a read finds no JSON functions
        self.older_entries = con is not None and con.execute(_OLDER).fetchone() is not None

    def notes(self) -> list[str]:
        """What a user must be told about this memo (once per run): read-only, entries of
        older ctxprec versions left unread."""
        out = []
        if self.read_only:
            out.append(
                f"memo {self.directory} is read-only: verdicts it holds are used, new ones are "
                "not kept"
            )
        if self.older_entries:
            out.append(
                f"memo {self.directory} holds verdicts stored by ctxprec before memo format v2 "
                "(pickled values): they are not read, so those items are judged again once; "
                "`ctxprec cache clear --old-format` removes them"
            )
        return out

    # -- reads
    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        # plain reads, no transaction: in WAL mode they never wait for the memo writer
        found: dict[str, MemoEntry] = {}
        if self._con is None or not keys:
            return found
        now = time.time()
        # in the table's key order: neighbouring lookups share the B-tree pages SQLite just
        # read (a batch of 10,000 keys of a 1 M-entry memo reads ~10 % faster; sorting it
        # costs ~1 ms); `found` is a dict, so the order it is filled in does not matter
        keys = sorted(keys)
        bad = 0
        if self._json_reads:
            try:
                for start in range(0, len(keys), _JSON_KEYS):
                    bad += self._read_ordered(keys[start : start + _JSON_KEYS], now, found)
                self._count_unreadable(bad)
                return found
            except sqlite3.OperationalError:  # an SQLite without JSON functions
                self._json_reads = False
                found.clear()
                bad = 0
        for chunk in _chunks(keys):
            bad += self._read_packed(chunk, now, found)
        self._count_unreadable(bad)
        return found

    def _count_unreadable(self, n: int) -> None:
        if n:
            with self._counting:
                self.unreadable += n

    def _fetch(self, query: str, params: Sequence[Any]) -> Any:
        con = self._take_reader()
        try:
            return con.execute(query, params).fetchone()
        finally:
            self._readers.put(con)

    def _read_ordered(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> int:
        """One `_SELECT_ORDERED` read of `keys`; their entries go into `found`; the number of
        rows found that are not verdicts."""
        flags, headers, reasons = self._fetch(_SELECT_ORDERED, (json.dumps(keys), now))
        if not flags or ("1" not in flags and "2" not in flags):  # nothing there
            return 0
        return self._take(keys, flags, headers, reasons, now, found)

    def _read_packed(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> int:
        """One `_SELECT_PACKED` read of up to `_CHUNK` keys; as `_read_ordered`."""
        count, packed, flags, headers, reasons = self._fetch(
            _SELECT_PACKED.format(_marks(len(keys))), (*keys, now)
        )
        if not count:
            return 0
        got = packed.split(_SEP)
        if len(got) != count:  # a key holding the separator: read these keys row by row
            return self._get_rows(keys, now, found)
        return self._take(got, flags, headers, reasons, now, found)

    def _take(
        self,
        keys: Sequence[str],
        flags: str,
        headers: bytes | None,
        reasons: bytes | None,
        now: float,
        found: dict[str, MemoEntry],
    ) -> int:
        """The verdicts of one read into `found` (`keys` and `flags` in the same order); the
        rows that were not verdicts. A batch whose reasons do not split back into one per
        verdict (a forged value) is read again row by row."""
        n = flags.count("1")
        entries = decode_columns(headers or b"", reasons or b"", n)
        if entries is None:
            return self._get_rows(keys, now, found)
        if n == len(keys):  # every key a verdict (the warm path): no Python step per key
            found.update(zip(keys, entries, strict=True))
            return 0
        found.update(zip(compress(keys, map("1".__eq__, flags)), entries, strict=True))
        return flags.count("2")

    def _get_rows(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> int:
        """The same read, one row per key, each value decoded on its own."""
        bad = 0
        for chunk in _chunks(sorted(set(keys))):
            rows = self._fetch_all(_SELECT.format(_marks(len(chunk))), (*chunk, now))
            for key, mode, filename, value in rows:
                entry = decode_entry(value) if mode == MODE_RAW and filename is None else None
                if entry is None:
                    bad += 1
                else:
                    found[key] = entry
        return bad

    def _fetch_all(self, query: str, params: Sequence[Any]) -> list[Any]:
        con = self._take_reader()
        try:
            return con.execute(query, params).fetchall()
        finally:
            self._readers.put(con)

    def _take_reader(self) -> sqlite3.Connection:
        """A read connection of the memo's own small pool: a free one, a new one while fewer
        than `_READERS` are open, else the next one given back. Two batch planners read at once
        (SQLite runs a query without the GIL: a 1 M-entry memo read by two threads, 180,000 keys/s
        on one shared connection, 260,000 on two). The pool is bounded because each connection
        holds its own page cache and memory map of the file."""
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            pass
        with self._opening:
            if len(self._opened) < _READERS:
                con = connect_reader(self._target, self._uri)
                self._opened.append(con)
                return con
        return self._readers.get()

    # -- writes
    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        """Store verdicts in one transaction: on a full disk none of them is kept. New keys go
        in with one INSERT for all (a few multi-row ones without SQLite's JSON functions); a
        key already there takes its new value in place. A read-only memo keeps none (counted
        in `not_kept`)."""
        rows = {key: encode_entry(value) for key, value in entries}
        n = len(rows)
        if not rows:
            return n
        con = self._con
        if self.read_only or con is None:
            self.not_kept += n
            return n
        try:
            with self._writing:  # two judges' dispatchers (an audit judge) may share the memo
                con.execute("BEGIN IMMEDIATE")
                try:
                    self._write(con, rows)
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                con.execute("COMMIT")
        except (OSError, sqlite3.Error) as exc:
            if is_read_only_error(exc):  # a read-only mount that os.access did not tell
                self.read_only = True
                self.not_kept += n
                return n
            raise write_failed(self.directory, exc) from exc
        return n

    def _write(self, con: sqlite3.Connection, rows: dict[str, bytes]) -> None:
        odd = {k: v for k, v in rows.items() if not (k.isascii() and k.isprintable())}
        for key in odd:  # keys JSON would escape: one by one (none of ours: ours are hex)
            del rows[key]
        if self._json_writes:
            stored: dict[str, bytes] = {}
            for part in _slices(rows, self.step_rows):
                stored.update(self._insert_new(con, part))
        else:
            stored = {key: rows.pop(key) for key in self._existing(con, list(rows))}
            self._insert_rows(con, rows)
        stored.update(odd)
        now = time.time()
        for key, value in stored.items():
            if con.execute(_UPDATE, (now, value, key)).rowcount == 0:
                con.execute(_INSERT + _ROW, (key, now, now, value))

    def _insert_new(self, con: sqlite3.Connection, rows: Mapping[str, bytes]) -> dict[str, bytes]:
        """INSERT OR IGNORE every key at once (one SQLite step: the GIL is handed over once);
        returns the rows whose keys were stored already, which the INSERT left as they were."""
        index: list[tuple[str, int, int]] = []
        blobs = bytearray()
        at = 1
        for key, value in rows.items():
            index.append((key, at, len(value)))
            blobs += value
            at += len(value)
        cursor = con.execute(_INSERT_JSON, (time.time(), blobs, json.dumps(index)))
        inserted = cursor.rowcount
        if inserted == len(index):
            return {}
        keys = list(rows)
        if inserted <= 0:
            stored = keys
        else:
            # this INSERT's rows are the rowids above the table's largest before it (the Cache
            # table has no AUTOINCREMENT, and the write lock keeps other writers out)
            assert cursor.lastrowid is not None
            first = cursor.lastrowid - inserted + 1
            (packed,) = con.execute(_STORED_JSON, (json.dumps(keys), first)).fetchone()
            stored = json.loads(packed)
        return {key: rows[key] for key in stored}

    @staticmethod
    def _existing(con: sqlite3.Connection, keys: list[str]) -> list[str]:
        """Which of `keys` are stored already (for an SQLite without JSON functions)."""
        return [
            key
            for chunk in _chunks(keys)
            for (key,) in con.execute(_EXISTING.format(_marks(len(chunk))), chunk).fetchall()
        ]

    @staticmethod
    def _insert_rows(con: sqlite3.Connection, rows: Mapping[str, bytes]) -> None:
        """INSERT new keys with multi-row INSERTs (for an SQLite without JSON functions)."""
        now = time.time()
        params = [(key, now, now, value) for key, value in rows.items()]
        for start in range(0, len(params), _INSERT_ROWS):
            part = params[start : start + _INSERT_ROWS]
            con.execute(_INSERT + ",".join([_ROW] * len(part)), [x for row in part for x in row])

    # -- `ctxprec cache`
    def stats(self) -> tuple[int, float | None, float | None]:
        """Entries, and the oldest and newest store times
        (`ctxprec.storage.memo.database.table_stats`)."""
        return (0, None, None) if self._con is None else table_stats(self._con)

    def tally(self, cutoff: float | None, old_format: bool = False) -> Tally:
        """What `clear` with the same arguments would remove: entries, bytes, tokens."""
        if self._con is None:
            return Tally(0, 0, 0, 0)
        return tally_rows(self._con, cutoff, _OLDER_ROWS if old_format else None)

    def clear(self, cutoff: float | None, old_format: bool = False) -> int:
        """Remove the entries stored before `cutoff` (None: all), only those of memo formats
        before v2 when `old_format`; how many went."""
        if self._con is None:
            return 0
        if self.read_only:
            raise OutputError(
                f"the memo {self.directory} is read-only: nothing removed; clear it where it "
                "can be written"
            )
        try:
            removed = clear_rows(
                self._con, self.directory, cutoff, _OLDER_ROWS if old_format else None
            )
        except (OSError, sqlite3.Error) as exc:
            raise write_failed(self.directory, exc) from exc
        self.older_entries = self._con.execute(_OLDER).fetchone() is not None
        return removed

    def __len__(self) -> int:
        if self._con is None:
            return 0
        (n,) = self._con.execute("SELECT count(*) FROM Cache").fetchone()
        return int(n)

    def close(self) -> None:
        with self._opening:
            for con in self._opened:
                con.close()
            self._opened.clear()
            self._readers = queue.SimpleQueue()
        if self._con is not None:
            self._con.close()
            self._con = None
