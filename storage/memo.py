"""On-disk verdict memo (diskcache) and its key recipe.

A key is a tagged SHA-256 over everything that changes a verdict: the judge's identity
(provider, model, base URL, decoding), the prompt version, query, expected output and item.
Entries are never evicted (eviction_policy "none"): a verdict once paid for stays.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Final, Protocol

import platformdirs

from storage.core.errors import OutputError
from storage.core.verdict import JudgeReply
from storage.layout import memo_db

__all__ = [
    "INPUT_TOKENS",
    "MEMO_RECIPE",
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

MEMO_RECIPE = "ctxprec-memo-v1"  # change when the recipe below changes

# (relevant, reason, input_tokens, output_tokens): a plain tuple, as the memo pickles it; read
# its fields by these names, not by number
MemoEntry = tuple[bool, str, int, int]


def entry_of(reply: JudgeReply) -> MemoEntry:
    """A judge's reply for one item as the memo keeps it."""
    v = reply.verdict
    return (v.relevant, v.reason, reply.input_tokens, reply.output_tokens)


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
        keys.append("v1-" + h.hexdigest())
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


def _write_failed(directory: Path, exc: BaseException) -> OutputError:
    reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return OutputError(
        f"cannot write the memo in {directory}: {reason}; the verdicts of this batch are not "
        "kept there: free some space (or give a writable --cache-dir) and run the same command "
        "again to finish"
    )


# Batched access to diskcache's table (diskcache 5: `Cache(key, raw, store_time, expire_time,
# access_time, access_count, tag, size, mode, filename, value)`, unique index on (key, raw)).
# String keys are stored as they are (raw = 1); a verdict tuple is pickled into `value`, or into a
# file named by `filename` when it is large (`Disk.fetch` reads both). One query per chunk of
# keys replaces one query per key, and new keys go in with multi-row INSERTs.
#
# Each SQLite step releases the GIL and takes it back: a query returning one row per key, or an
# `executemany`, hands the GIL over once per row. While another thread runs Python (the judge,
# the rows of another batch) each hand-back waits for that thread's switch interval (5 ms): a
# convoy that made 100,000 inserts take 570 s instead of 2 s. So reads come back as one row per
# chunk and writes go in as one statement per chunk of rows: one step, one hand-over.
#
# The read's one row holds the chunk's keys joined by a separator, a flag per key ("1": its
# pickle is inline) and the inline pickles back to back. Pickles are self-delimiting, so one
# `Unpickler` reads them in order; decoding them this way costs half of what JSON with hex did.
_CHUNK = 900  # under SQLite's oldest limit of 999 bound parameters (the time is one more)
_MODE_PICKLE = 4  # diskcache.core.MODE_PICKLE
_SEP = "\x1f"  # between keys of the packed read (a key holding it takes the row-per-key read)
_WHERE = "raw = 1 AND key IN ({}) AND (expire_time IS NULL OR expire_time > ?)"
_SELECT = "SELECT key, mode, filename, value FROM Cache WHERE " + _WHERE
_INLINE = f"mode = {_MODE_PICKLE} AND filename IS NULL AND value IS NOT NULL"
_SELECT_PACKED = (
    "SELECT count(*), group_concat(key, char(31)),"
    f" group_concat(CASE WHEN {_INLINE} THEN '1' ELSE '0' END, ''),"
    f" CAST(group_concat(CASE WHEN {_INLINE} THEN value END, '') AS BLOB)"
    " FROM Cache WHERE " + _WHERE
)
# The read of a whole batch, with its keys as one JSON array: one statement, so the reading
# thread takes the GIL back once per batch instead of once per 900 keys. Its rows follow the
# array (a LEFT JOIN from json_each probes the index key by key, in the order asked: `get_many`
# asks in key order): one flag per key asked ("0" not there, "1" inline, "2" elsewhere) and the
# inline pickles back to back, so the keys need not come back. Where SQLite
# has no JSON functions, the IN (?, ?, ...) form above is used.
_SELECT_ORDERED = (
    "SELECT group_concat(CASE WHEN c.rowid IS NULL THEN '0'"
    f" WHEN c.{_INLINE.replace(' AND ', ' AND c.')} THEN '1' ELSE '2' END, ''),"
    f" CAST(group_concat(CASE WHEN c.{_INLINE.replace(' AND ', ' AND c.')} THEN c.value END, '')"
    " AS BLOB) FROM json_each(?) AS j LEFT JOIN Cache AS c ON c.key = j.value AND c.raw = 1"
    " AND (c.expire_time IS NULL OR c.expire_time > ?)"
)
_JSON_KEYS = 20_000  # keys per JSON read
_READERS = 2  # read connections at most (`Memo._take_reader`): the two batch planners
_EXISTING = "SELECT key FROM Cache WHERE raw = 1 AND key IN ({})"
_INSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size,"
    " mode, filename, value) VALUES "
)
_ROW = "(?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)"
_INSERT_ROWS = 999 // 7  # rows of 7 parameters in one INSERT
_STEP_ROWS = 50_000  # rows of one JSON INSERT (a bigger write is several: bounded memory)
# All new keys of a write in one step (SQLite's JSON functions): the keys and where each pickled
# value lies in one BLOB of them all, as one JSON text of [key, offset, length] rows.
_INSERT_JSON = (
    "INSERT OR IGNORE INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) SELECT json_extract(j.value, '$[0]'), 1, ?1, NULL, ?1, 0,"
    f" NULL, 0, {_MODE_PICKLE}, NULL, substr(?2, json_extract(j.value, '$[1]'),"
    " json_extract(j.value, '$[2]')) FROM json_each(?3) AS j"
)
# which of the keys were stored before the INSERT (a rowid below its first)
_STORED_JSON = (
    "SELECT json_group_array(c.key) FROM json_each(?) AS j CROSS JOIN Cache AS c"
    " ON c.key = j.value AND c.raw = 1 WHERE c.rowid < ?"
)


def _chunks(keys: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start : start + _CHUNK]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _slices(rows: dict[str, MemoEntry], n: int) -> Iterable[dict[str, MemoEntry]]:
    if len(rows) <= n:
        yield rows
        return
    items = iter(rows.items())
    while part := dict(islice(items, n)):
        yield part


def _has_json(sql: Any) -> bool:
    """Whether this SQLite has the JSON functions (built in since 3.38, an option before)."""
    try:
        sql("SELECT json_extract('[1]', '$[0]')").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


class Memo:
    """A wrapper over diskcache.Cache that reads and writes in batches; call its methods from a
    worker thread. Entries stay readable (and writable) by diskcache's own `get`/`set`."""

    def __init__(self, directory: Path):
        import diskcache

        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(
                str(directory),
                eviction_policy="none",
                size_limit=2**62,
                cull_limit=0,
                statistics=False,
            )
            self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
            self._opened: list[sqlite3.Connection] = []
            self._opening = threading.Lock()
        except (OSError, sqlite3.Error) as exc:
            raise _write_failed(directory, exc) from exc
        self._json_writes = _has_json(self._cache._sql)
        self._json_reads = self._json_writes  # turned off too if a read finds no JSON functions

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        # plain reads, no transaction: in WAL mode they never wait for the memo writer
        # (a `transact()` here would take SQLite's write lock and stall behind every write)
        found: dict[str, MemoEntry] = {}
        now = time.time()
        # in the table's key order: neighbouring lookups share the B-tree pages SQLite just
        # read (a batch of 10,000 keys of a 1 M-entry memo reads ~10 % faster; sorting it
        # costs ~1 ms); `found` is a dict, so the order it is filled in does not matter
        keys = sorted(keys)
        if self._json_reads:
            try:
                for start in range(0, len(keys), _JSON_KEYS):
                    self._read_ordered(keys[start : start + _JSON_KEYS], now, found)
                return found
            except sqlite3.OperationalError:  # an SQLite without JSON functions
                self._json_reads = False
                found.clear()
        for chunk in _chunks(keys):
            self._read_packed(chunk, now, found)
        return found

    def _fetch(self, query: str, params: Sequence[Any]) -> Any:
        con = self._take_reader()
        try:
            return con.execute(query, params).fetchone()
        finally:
            self._readers.put(con)

    def _read_ordered(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> None:
        """One `_SELECT_ORDERED` read of `keys`; their entries go into `found`."""
        flags, blob = self._fetch(_SELECT_ORDERED, (json.dumps(keys), now))
        if not blob and "2" not in flags:  # nothing there
            return
        load = pickle.Unpickler(io.BytesIO(blob or b"")).load
        if flags.count("1") == len(keys):  # every entry inline (the usual case): in one go
            found.update(zip(keys, [load() for _ in range(len(keys))], strict=True))
            return
        self._decode(zip(keys, flags, strict=True), load, found)

    def _read_packed(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> None:
        """One `_SELECT_PACKED` read of up to `_CHUNK` keys; their entries go into `found`."""
        count, packed, inline, blob = self._fetch(
            _SELECT_PACKED.format(_marks(len(keys))), (*keys, now)
        )
        if not count:
            return
        got = packed.split(_SEP)
        if len(got) != count:  # a key holding the separator: read these keys row by row
            self._get_rows(keys, now, found)
            return
        load = pickle.Unpickler(io.BytesIO(blob or b"")).load
        self._decode(zip(got, inline, strict=True), load, found)

    def _decode(
        self, flagged: Iterable[tuple[str, str]], load: Any, found: dict[str, MemoEntry]
    ) -> None:
        get = self._cache.get
        for key, flag in flagged:
            if flag == "1":
                found[key] = load()
            elif flag != "0":  # a big entry kept in its own file, or a value stored raw
                entry = get(key)
                if entry is not None:
                    found[key] = entry

    def _take_reader(self) -> sqlite3.Connection:
        """A read connection of the memo's own small pool: a free one, a new one while fewer
        than `_READERS` are open, else the next one given back. Two batch planners read at once
        (SQLite runs a query without the GIL: a 1 M-entry memo read by two threads, 180,000 keys/s
        on one shared connection, 260,000 on two). The pool is bounded because each connection
        holds its own page cache and memory map of the file (diskcache opens one per thread,
        which multiplied the memory a thread pool's reads took)."""
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            pass
        with self._opening:
            if len(self._opened) < _READERS:
                cache = self._cache
                con = sqlite3.connect(
                    str(memo_db(self.directory)),
                    timeout=60,
                    isolation_level=None,
                    check_same_thread=False,  # taken from the pool by one thread at a time
                )
                con.execute(f"PRAGMA cache_size = {int(cache.sqlite_cache_size)}")
                con.execute(f"PRAGMA mmap_size = {int(cache.sqlite_mmap_size)}")
                self._opened.append(con)
                return con
        return self._readers.get()

    def _get_rows(self, keys: Sequence[str], now: float, found: dict[str, MemoEntry]) -> None:
        """The same read, one row per key."""
        fetch = self._cache.disk.fetch
        rows = self._cache._sql(_SELECT.format(_marks(len(keys))), (*keys, now)).fetchall()
        for key, mode, filename, value in rows:
            try:
                entry = fetch(mode, filename, value, False)
            except OSError:  # removed since the query: a miss, as Cache.get has it
                continue
            if entry is not None:
                found[key] = entry

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        """Store verdicts in one transaction: on a full disk none of them is kept. New keys go
        in with one INSERT for all (a few multi-row ones without SQLite's JSON functions); a
        key already there, or a value big enough for a file of its own, goes through
        `Cache.set` (an old entry may own a file to clean up)."""
        rows: dict[str, MemoEntry] = {}
        n = 0
        cache = self._cache
        for key, value in entries:
            if type(key) is not str:  # not stored raw: diskcache's own path
                cache.set(key, value)
            else:
                rows[key] = value
            n += 1
        if not rows:
            return n
        try:
            with cache.transact():
                if self._json_writes:
                    left: dict[str, MemoEntry] = {}
                    for part in _slices(rows, _STEP_ROWS):
                        left.update(self._insert_new(part))
                    rows = left
                else:
                    for key in self._existing(list(rows)):
                        cache.set(key, rows.pop(key))
                    rows = self._insert_rows(rows)
                for key, value in rows.items():
                    cache.set(key, value)
        except (OSError, sqlite3.Error) as exc:
            raise _write_failed(self.directory, exc) from exc
        return n

    def _pickled(
        self, rows: Mapping[str, MemoEntry]
    ) -> tuple[list[tuple[str, int, int]], bytearray, dict[str, MemoEntry]]:
        """Each verdict pickled as `Disk.store` pickles it into the row: (key, 1-based offset
        in the concatenated pickles, length) and the pickles, concatenated; the rest (values big
        enough for a file, keys that are not plain printable ASCII) is left to `Cache.set`."""
        disk = self._cache.disk
        protocol, small, dumps = disk.pickle_protocol, disk.min_file_size, pickle.dumps
        index: list[tuple[str, int, int]] = []
        blobs = bytearray()
        left: dict[str, MemoEntry] = {}
        at = 1
        for key, value in rows.items():
            data = dumps(value, protocol=protocol) if type(value) is tuple else None
            if data is None or len(data) >= small or not (key.isascii() and key.isprintable()):
                left[key] = value
                continue
            index.append((key, at, len(data)))
            blobs += data
            at += len(data)
        return index, blobs, left

    def _insert_new(self, rows: Mapping[str, MemoEntry]) -> dict[str, MemoEntry]:
        """INSERT OR IGNORE every key at once (one SQLite step: the GIL is handed over once);
        returns the rows left for `Cache.set`: the keys stored already, which the INSERT left
        as they were, and what `_pickled` left."""
        index, blobs, left = self._pickled(rows)
        if not index:
            return left
        sql = self._cache._sql
        cursor = sql(_INSERT_JSON, (time.time(), blobs, json.dumps(index)))
        inserted = cursor.rowcount
        if inserted == len(index):
            return left
        keys = [key for key, _, _ in index]
        if inserted <= 0:
            stored = keys
        else:
            # this INSERT's rows are the rowids above the table's largest before it (the Cache
            # table has no AUTOINCREMENT, and the write lock keeps other writers out)
            first = cursor.lastrowid - inserted + 1
            (packed,) = sql(_STORED_JSON, (json.dumps(keys), first)).fetchone()
            stored = json.loads(packed)
        for key in stored:
            left[key] = rows[key]
        return left

    def _existing(self, keys: list[str]) -> list[str]:
        """Which of `keys` are stored already (for an SQLite without JSON functions)."""
        sql = self._cache._sql
        return [
            key
            for chunk in _chunks(keys)
            for (key,) in sql(_EXISTING.format(_marks(len(chunk))), chunk).fetchall()
        ]

    def _insert_rows(self, rows: Mapping[str, MemoEntry]) -> dict[str, MemoEntry]:
        """INSERT new keys with multi-row INSERTs (for an SQLite without JSON functions);
        returns what `_pickled` left."""
        index, blobs, left = self._pickled(rows)
        now = time.time()
        params = [
            (key, now, now, 0, _MODE_PICKLE, None, bytes(blobs[at - 1 : at - 1 + n]))
            for key, at, n in index
        ]
        sql = self._cache._sql
        for start in range(0, len(params), _INSERT_ROWS):
            part = params[start : start + _INSERT_ROWS]
            sql(_INSERT + ",".join([_ROW] * len(part)), [x for row in part for x in row])
        return left

    def __len__(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        with self._opening:
            for con in self._opened:
                con.close()
            self._opened.clear()
            self._readers = queue.SimpleQueue()
        self._cache.close()
