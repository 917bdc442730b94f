"""The memo key recipe and the diskcache store."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

import ctxprec.storage.memo.store as memo_module
from ctxprec.storage.memo.codec import MAX_REASON_BYTES, decode_entry, encode_entry
from ctxprec.storage.memo.store import Memo, item_keys, judge_prefix, memo_key, row_hasher


def test_key_changes_with_everything_that_changes_a_verdict() -> None:
    p = judge_prefix({"provider": "openai", "model": "m", "temperature": 0.0})
    base = memo_key(p, "v1", "q", "e", "item")
    assert base == memo_key(p, "v1", "q", "e", "item")
    others = {
        memo_key(
            judge_prefix({"provider": "openai", "model": "m2", "temperature": 0.0}),
            "v1",
            "q",
            "e",
            "item",
        ),
        memo_key(
            judge_prefix({"provider": "openai", "model": "m", "temperature": 0.7}),
            "v1",
            "q",
            "e",
            "item",
        ),
        memo_key(p, "v2", "q", "e", "item"),
        memo_key(p, "v1", "q2", "e", "item"),
        memo_key(p, "v1", "q", None, "item"),
        memo_key(p, "v1", "q", "e", "item2"),
        memo_key(p, "v1", "qe", "", "item"),  # field boundaries cannot be shifted
    }
    assert base not in others
    assert len(others) == 7
    assert base.startswith("v2-")


def test_memo_roundtrip_and_no_eviction_policy(tmp_path: Path) -> None:
    memo = Memo(tmp_path / "m")
    assert memo.set_many([("a", (True, "r", 3, 1)), ("b", (False, "s", 2, 1))]) == 2
    assert memo.get_many(["a", "b", "c"]) == {"a": (True, "r", 3, 1), "b": (False, "s", 2, 1)}
    memo.close()
    again = Memo(tmp_path / "m")
    assert len(again) == 2
    again.close()


def test_item_keys_from_one_row_hasher_equal_memo_key() -> None:
    p = judge_prefix({"provider": "offline", "model": "offline"})
    items = ["a", "", "é\ud800x", "item " * 300]
    row = row_hasher(p, "v1", "q", None)
    assert item_keys(row, items) == [memo_key(p, "v1", "q", None, it) for it in items]
    # the recipe itself is pinned: a change here orphans every memo on disk
    assert memo_key(p, "v1", "q", "e", "item") == (
        "v2-" + hashlib.sha256(p + b"2:v11:q1:e4:item").hexdigest()
    )


def test_batched_writes_are_diskcache_raw_rows_that_diskcache_reads_as_bytes(
    tmp_path: Path,
) -> None:
    """The memo is diskcache 5's table: a verdict is a raw-mode row whose value is its fixed
    layout (`ctxprec.storage.memo.codec`), so diskcache's own `get` returns those bytes (never a
    pickle); a big reason is clipped into the row (no file of its own); a replaced key works too."""
    import diskcache

    memo = Memo(tmp_path / "m")
    big = (True, "r" * 100_000, 1, 2)
    keys = [f"k{i}" for i in range(2_000)]  # more than one chunk of the IN (...) query
    assert memo.set_many([(k, (True, k, 1, 1)) for k in keys] + [("big", big)]) == 2_001
    assert memo.set_many([("k5", (False, "again", 0, 0))]) == 1
    found = memo.get_many([*keys, "big", "missing", "k3"])  # k3 asked twice
    assert len(found) == 2_001
    assert found["big"] == (True, "r" * MAX_REASON_BYTES, 1, 2)
    assert found["k7"] == (True, "k7", 1, 1)
    assert found["k5"] == (False, "again", 0, 0)
    assert memo.unreadable == 0
    memo.close()
    with diskcache.Cache(str(tmp_path / "m")) as cache:
        assert cache.get("k9") == encode_entry((True, "k9", 1, 1))
        assert decode_entry(cache.get("k5")) == (False, "again", 0, 0)
        assert len(cache) == 2_001  # diskcache's count (kept by its triggers) sees every insert
    assert not list((tmp_path / "m").rglob("*.val"))


def test_writes_and_reads_are_one_statement_per_chunk(tmp_path: Path) -> None:
    """Each SQLite step hands the GIL over; a row-per-key query or an executemany does so once
    per key, which stalls behind any thread running Python (storage/memo/store.py). 2,000 new keys
    go in as one INSERT (a handful of multi-row ones for an SQLite without JSON functions) and are
    read back with one SELECT (one per 900 keys without JSON functions); keys holding the packed
    read's separator take the row-per-key read and are found too."""
    memo = Memo(tmp_path / "m")
    statements: list[str] = []
    assert memo._con is not None
    memo._con.set_trace_callback(statements.append)
    entries = [(f"k{i}", (i % 2 == 0, f"why {i}", i, 1)) for i in range(2_000)]
    assert memo.set_many(entries) == 2_000
    # (SQLite also reports each trigger run with the text of the statement that fired it)
    inserts = {s for s in statements if s.startswith("INSERT")}
    assert len(inserts) == 1
    keys = [k for k, _ in entries] + ["missing"]
    reader = memo._take_reader()  # batched reads' connection (one thread: always this one)
    reader.set_trace_callback(statements.append)
    memo._readers.put(reader)
    statements.clear()
    assert memo.get_many(keys) == dict(entries)
    assert len([s for s in statements if s.startswith("SELECT")]) == 1  # keys as a JSON array
    # an SQLite without JSON functions: multi-row INSERTs, one SELECT per 900 keys
    without_json = Memo(tmp_path / "m2", json_sql=False)
    statements.clear()
    assert without_json._con is not None
    without_json._con.set_trace_callback(statements.append)
    assert without_json.set_many(entries) == 2_000
    inserts = {s for s in statements if s.startswith("INSERT")}
    assert len(inserts) == -(-2_000 // memo_module._INSERT_ROWS)  # 15, not 2,000
    reader = without_json._take_reader()
    reader.set_trace_callback(statements.append)
    without_json._readers.put(reader)
    statements.clear()
    assert without_json.get_many(keys) == dict(entries)
    assert len([s for s in statements if s.startswith("SELECT")]) == 3  # 2,001 keys: 3 chunks
    odd = [(f"a{memo_module._SEP}{i}", (True, f"odd {i}", 0, 0)) for i in range(3)]
    without_json.set_many(odd)
    assert without_json.get_many([k for k, _ in odd] + keys[:5]) == dict(odd + entries[:5])
    assert without_json.get_many(keys) == dict(entries)
    memo.close()
    without_json.close()


@pytest.mark.parametrize(("json_writes", "step"), [(True, 50_000), (True, 2), (False, 50_000)])
def test_a_write_mixing_stored_and_new_keys_replaces_the_stored_ones(
    tmp_path: Path, json_writes: bool, step: int
) -> None:
    """New keys go in with one INSERT OR IGNORE (one per `step` rows); the keys it found stored
    (told apart by their rowid) take their new value in place, as does a key JSON would have to
    escape; a row diskcache stored in a file of its own is replaced without its file being
    touched (a row's `filename` is not trusted). The row count stays right."""
    import diskcache

    folder = tmp_path / "m"
    Memo(folder).close()
    with diskcache.Cache(str(folder)) as cache:
        cache.set("old1", (False, "from diskcache", 5, 6))
        cache.set("old3", (False, "r" * 100_000, 0, 0))  # kept in a file of its own
    memo = Memo(folder, step_rows=step, json_sql=json_writes)
    memo.set_many([("old2", (False, "first write", 0, 0))])
    assert memo._con is not None
    before = dict(memo._con.execute("SELECT key, store_time FROM Cache").fetchall())
    entries = [
        ("new1", (True, "n1", 0, 0)),
        ("old1", (True, "replaced 1", 0, 0)),
        ("new2", (False, "n2", 0, 0)),
        ("old2", (True, "replaced 2", 0, 0)),
        ("old3", (True, "replaced 3", 0, 0)),
        ("é\x01 key", (True, "escaped", 0, 0)),
        ('a "quoted" back\\slash key', (False, "JSON escapes it", 0, 0)),
    ]
    assert memo.set_many(entries) == 7
    assert memo.get_many([k for k, _ in entries]) == dict(entries)
    after = dict(memo._con.execute("SELECT key, store_time FROM Cache").fetchall())
    assert all(after[k] > before[k] for k in before)  # the stored ones were written again
    assert len(memo) == 7
    assert len(list(folder.rglob("*.val"))) == 1  # old3's file left alone, no new one
    memo.close()


def test_batched_reads_share_a_pool_of_two_connections(tmp_path: Path) -> None:
    """Two threads read at once on two connections (SQLite runs a query without the GIL), never
    more: each connection holds its own page cache and memory map of the file."""
    memo = Memo(tmp_path / "m")
    entries = [(f"k{i}", (i % 3 == 0, f"why {i}", i, 1)) for i in range(4_000)]
    memo.set_many(entries)
    want = dict(entries)
    start = threading.Barrier(4)
    seen: list[dict[str, Any]] = []

    def read(part: int) -> None:
        start.wait()
        got: dict[str, Any] = {}
        for _ in range(20):
            got.update(memo.get_many([k for k, _ in entries[part::4]]))
        seen.append(got)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {k: v for got in seen for k, v in got.items()} == want
    assert 1 <= len(memo._opened) <= memo_module._READERS == 2
    memo.close()
    assert memo._opened == []


def test_journal_lines_are_untrusted_a_bad_one_is_skipped_and_counted(tmp_path: Path) -> None:
    """A journal left in the memo folder is replayed line by line: each line bounded and checked
    field by field; a line that is not a record is skipped and counted, the records after it
    still replayed; a torn last line (a kill mid-write) ends the journal uncounted."""
    import json

    from ctxprec.storage.files.layout import journal_dir, journal_file
    from ctxprec.storage.memo.journal import replay_journals

    folder = tmp_path / "m"
    memo = Memo(folder)
    journal_dir(folder).mkdir()
    good = [["v2-a", True, "why a", 3, 1], ["v2-b", False, "why b", 2, 0]]
    bad = [
        b"not json",
        json.dumps(["v2-c", "yes", "relevant as text", 1, 1]).encode(),
        json.dumps(["v2-d", True, "negative tokens", -1, 1]).encode(),
        json.dumps(["v2-e", True, "r" * 40_000, 1, 1]).encode(),  # a reason past the bound
        json.dumps(["v2-f", True, "tokens past the bound", 2**60, 1]).encode(),
        json.dumps(["v2-g\n", True, "a key with a newline", 1, 1]).encode(),
        json.dumps({"key": "v2-h"}).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # nesting past the JSON decoder's depth
        b'["v2-i", true, "' + b"x" * (2 << 20) + b'", 1, 1]',  # a line past the 1 MiB bound
    ]
    lines = [json.dumps(good[0]).encode(), *bad, json.dumps(good[1]).encode()]
    path = journal_file(folder, "0123456789abcdef")  # a name of ctxprec's pattern
    path.write_bytes(b"\n".join(lines) + b'\n["v2-z", true, "torn')
    done = replay_journals(folder, memo)
    assert (done.replayed, done.skipped) == (2, len(bad))
    assert memo.get_many(["v2-a", "v2-b", "v2-c", "v2-i", "v2-z"]) == {
        "v2-a": (True, "why a", 3, 1),
        "v2-b": (False, "why b", 2, 0),
    }
    assert not path.exists()
    memo.close()


def test_planted_rows_are_misses_never_unpickled(tmp_path: Path) -> None:
    """Rows planted by diskcache's own `set` (a pickle) and by raw SQL (a pickle claiming pickle
    mode, one claiming raw mode, a file outside the folder) are misses, counted; a clean read
    after them finds the rest, in both read paths."""
    import pickle
    import sqlite3

    import diskcache

    folder = tmp_path / "m"
    memo = Memo(folder)
    keys = [f"v2-{i}" for i in range(6)]
    memo.set_many([(k, (True, k, 1, 1)) for k in keys])
    memo.close()
    marker = tmp_path / "marker"

    class Boom:
        def __reduce__(self) -> Any:
            return (marker.write_text, ("ran",))

    evil = pickle.dumps(Boom())
    (tmp_path / "evil.val").write_bytes(evil)
    with diskcache.Cache(str(folder)) as dc:
        dc.set(keys[0], Boom())
    with sqlite3.connect(folder / "cache.db") as con:
        for key, mode, name, value in [
            (keys[1], 4, None, evil),
            (keys[2], 1, None, evil),
            (keys[3], 4, str(tmp_path / "evil.val"), None),
        ]:
            con.execute(
                "UPDATE Cache SET mode = ?, filename = ?, value = ? WHERE key = ?",
                (mode, name, value, key),
            )
    for json_reads in (True, False):
        memo = Memo(folder, json_sql=json_reads)
        assert memo.get_many(keys) == {k: (True, k, 1, 1) for k in keys[4:]}
        assert memo.unreadable == 4
        memo.close()
    assert not marker.exists()


def test_a_memo_another_process_is_creating_is_finished_not_refused(tmp_path: Path) -> None:
    """Found in CI: a Dask worker opened a fresh memo folder while the driver's diskcache was
    still creating cache.db (a file with no table yet), and the run was refused with exit 2.
    A database with no table at all (or an empty file) is finished by diskcache instead."""
    import sqlite3

    entry = (True, "reason", 3, 4)
    for name, make in {
        "empty-file": lambda db: db.write_bytes(b""),
        "no-table-yet": lambda db: sqlite3.connect(db).execute("PRAGMA user_version = 0"),
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        make(folder / "cache.db")
        memo = Memo(folder)
        memo.set_many([("k", entry)])
        assert memo.get_many(["k"]) == {"k": entry}
        memo.close()


def test_a_memo_opened_by_many_threads_at_once_is_created_once(tmp_path: Path) -> None:
    folder, errors = tmp_path / "fresh", []

    def open_it() -> None:
        try:
            Memo(folder).close()
        except Exception as exc:  # the test reports any failure below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_batch_with_one_forged_header_is_decoded_row_by_row(tmp_path: Path) -> None:
    """The batched read checks headers in C over the whole batch: one forged header among good
    ones (wrong magic, flag or token count) sends the batch to the row-by-row read, which keeps
    every good verdict and counts the forged one as unreadable."""
    import struct

    header = struct.Struct("<4sBQQ")
    forged = [
        header.pack(b"cpv9", 1, 1, 1) + b"wrong magic",
        header.pack(b"cpv2", 2, 1, 1) + b"flag 2",
        header.pack(b"cpv2", 1, 1, 2**57) + b"tokens past the bound",
    ]
    for n, value in enumerate(forged):
        memo = Memo(tmp_path / f"m{n}")
        good = {f"v2-{i:03d}": (i % 2 == 0, f"reason {i}", i, 2 * i) for i in range(50)}
        memo.set_many(good.items())
        assert memo._con is not None
        memo._con.execute("UPDATE Cache SET value = ? WHERE key = 'v2-025'", (value,))
        memo._con.commit()
        found = memo.get_many(list(good))
        assert found == {k: v for k, v in good.items() if k != "v2-025"}
        assert memo.unreadable == 1
        memo.close()
