"""The batch store's own folder: a killed run's chunk files are cleaned up, nothing else."""

from __future__ import annotations

from pathlib import Path

from ctxprec.storage.outdir.batches import BatchStore, ChunkWriter


def test_orphan_chunk_files_are_removed_and_other_files_kept(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    writer = ChunkWriter(store, 0, max_lines=10, max_bytes=1 << 20)
    writer.add("id-1", ["k1"], b'{"custom_id": "id-1"}')
    (kept,) = writer.close()
    orphan = store.new_name(0) + "x"  # a chunk a killed run wrote but never recorded
    store.lines_path(orphan).write_bytes(b"{}\n")
    store.ids_path(orphan).write_text("{}")
    users = {"notes.txt": "mine", "c-not-a-chunk.jsonl": "{}"}
    for name, text in users.items():
        (store.dir / name).write_text(text)
    store.remove_orphans()
    assert not store.lines_path(orphan).exists()
    assert not store.ids_path(orphan).exists()
    assert store.lines_path(kept).exists()
    assert store.ids_path(kept).exists()
    assert {name: (store.dir / name).read_text() for name in users} == users
