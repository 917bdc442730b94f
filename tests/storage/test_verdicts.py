"""The shared verdict store: group-committed Arrow files by rename, read back by any process, a
torn or foreign file is ignored, and a fresh memo is seeded from it."""

from __future__ import annotations

from pathlib import Path

from ctxprec.storage.memo.store import Memo, MemoEntry
from ctxprec.storage.outdir.verdicts import SharedMemo, VerdictStore, verdict_dir


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entries(n: int, start: int = 0) -> list[tuple[str, MemoEntry]]:
    return [(f"v1-{i}", (i % 2 == 0, f"reason {i}", 10 + i, 2)) for i in range(start, start + n)]


def test_writes_once_a_second_and_on_flush(tmp_path: Path) -> None:
    ticks = Ticks()
    store = VerdictStore(tmp_path / "v", flush_s=1.0, clock=ticks)
    store.append(entries(3))
    assert not (tmp_path / "v").exists()  # buffered: one file per second, not one per call
    ticks.now = 1.5
    store.append(entries(2, start=3))
    assert store.files_written == 1
    store.append(entries(1, start=5))
    store.flush()
    assert store.files_written == 2
    assert sorted(p.suffix for p in (tmp_path / "v").iterdir()) == [".arrow", ".arrow"]
    assert sorted(VerdictStore(tmp_path / "v").read()) == sorted(entries(6))


def test_torn_and_temp_files_are_ignored(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / "v")
    store.append(entries(2))
    store.flush()
    (tmp_path / "v" / "torn.arrow").write_bytes(b"ARROW1\x00\x00garbage")
    (tmp_path / "v" / ".half.arrow.tmp").write_bytes(b"ARROW1")
    assert sorted(VerdictStore(tmp_path / "v").read()) == sorted(entries(2))


def test_a_fresh_memo_is_seeded_from_the_store(tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    folder = verdict_dir(outdir, tmp_path / "in.parquet")
    first = SharedMemo(Memo(tmp_path / "memo-a"), VerdictStore(folder))
    first.set_many(entries(4))
    first.close()
    second = SharedMemo(Memo(tmp_path / "memo-b"), VerdictStore(folder))  # another machine
    try:
        assert second.imported == 4
        assert second.get_many([k for k, _ in entries(5)]) == dict(entries(4))
    finally:
        second.close()
    assert not list(outdir.rglob("*.parquet"))  # readers of OUTDIR/**/*.parquet never see them
