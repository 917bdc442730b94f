"""Judge keys by shard (storage/outdir/keyshards.py): shard counts, the request and answer files of
a cluster run, the verdicts by shard read back under any other shard count, and data files bound
for an object store made in memory, never on the local disk."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from ctxprec.storage.files.atomic import atomic_write
from ctxprec.storage.files.objpath import out_path
from ctxprec.storage.memo.store import MemoEntry
from ctxprec.storage.outdir.keyshards import (
    ShardedVerdicts,
    read_answers,
    read_requests,
    remove_tree,
    request_files,
    shard_count,
    shard_of,
    write_answers,
    write_requests,
)


def keys(n: int) -> list[str]:
    return ["v1-" + hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]


def test_shard_counts_are_powers_of_two_with_a_floor_and_a_ceiling() -> None:
    assert shard_count(0, 20_000, 4) == 4
    assert shard_count(100_000, 20_000, 4) == 8  # 5 wanted, rounded up
    assert shard_count(10**10, 20_000, 4) == 4096
    spread = [shard_of(k, 8) for k in keys(4000)]
    assert sorted(set(spread)) == list(range(8))
    assert min(spread.count(s) for s in range(8)) > 400  # even, near 500 each


def test_requests_and_answers_round_trip(tmp_path: Path) -> None:
    requests = [(k, f"q{i}", None if i % 2 else "exp", f"item {i}") for i, k in enumerate(keys(50))]
    write_requests(tmp_path, 3, 4, requests)
    got = [r for s in range(4) for path in request_files(tmp_path, s) for r in read_requests(path)]
    assert sorted(got) == sorted(requests)
    assert all(shard_of(r[0], 4) == s for s in range(4) for p in request_files(tmp_path, s)
               for r in read_requests(p))  # fmt: skip
    entry: MemoEntry = (True, "why", 10, 2)
    write_answers(tmp_path, 3, 0, [("a", entry, True, None), ("b", None, False, "cause: msg")])
    assert list(read_answers(tmp_path, 3)) == [
        ("a", entry, True, None),
        ("b", None, False, "cause: msg"),
    ]
    remove_tree(tmp_path / "keys")
    assert request_files(tmp_path, 0) == []


@pytest.mark.parametrize("reader_shards", [1, 2, 4, 8])
def test_verdicts_stored_under_one_shard_count_are_found_under_another(
    tmp_path: Path, reader_shards: int
) -> None:
    store = ShardedVerdicts.of(tmp_path)
    every = keys(200)
    for shard in range(4):  # a run of 4 shards stored its verdicts
        writer = store.writer(shard, 4, 0.0)
        writer.append((k, (True, k[-4:], 1, 1)) for k in every if shard_of(k, 4) == shard)
        writer.flush()
    extra = store.writer(0, 1, 0.0)  # a reduce's late verdict: any shard
    extra.append([(every[0], (False, "late", 0, 0))])
    extra.flush()
    for shard in range(reader_shards):
        found = store.read(shard, reader_shards)
        assert set(found) == {k for k in every if shard_of(k, reader_shards) == shard}


def test_data_files_for_an_object_store_never_touch_the_local_disk(
    bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    target = out_path(f"s3://{bucket}/out/_ctxprec/verdicts/keys/1-0-abc.arrow")
    table = pa.table({"key": ["k"]})

    def write(path: Path) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)

    atomic_write(target, write)  # a temp folder would fail: its parent does not exist
    assert target.read_bytes()[:6] == b"ARROW1"
