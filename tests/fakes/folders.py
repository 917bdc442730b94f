"""Output folders other tools wrote, user files planted inside ctxprec outputs, and checksums
to prove each of them is byte-identical after a run."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "FOREIGN_LAYOUTS",
    "USER_FILES_INSIDE",
    "assert_untouched",
    "checksums",
    "commit",
    "committed_files",
    "plant",
    "remount",
    "tmpfs",
]


def _parquet(rows: int = 3, tag: str = "theirs") -> bytes:
    """A real Parquet file whose columns are not ctxprec's."""
    table = pa.table({"user_id": list(range(rows)), "event": [f"{tag}-{i}" for i in range(rows)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return bytes(sink.getvalue().to_pybytes())


# Folders written by other tools: relative path -> bytes.
FOREIGN_LAYOUTS: dict[str, dict[str, bytes]] = {
    "spark": {
        "part-00000-abc.snappy.parquet": _parquet(tag="spark0"),
        "part-00001-abc.snappy.parquet": _parquet(tag="spark1"),
        "_SUCCESS": b"",
        ".part-00000-abc.snappy.parquet.crc": b"crc",
    },
    "hive": {
        "dt=2024-01-01/events.parquet": _parquet(tag="hive"),
        "dt=2024-01-02/part-00000.parquet": _parquet(tag="hive2"),
    },
    "hidden": {".hidden/x.parquet": _parquet(tag="hidden")},
    "summary_named": {"summary.json": b'{"mine": true}', "charts/scores.png": b"not a chart"},
    "one_text_file": {"notes.txt": b"mine"},
}

# Files a user adds inside a finished ctxprec output partitioned by `dt`.
USER_FILES_INSIDE: dict[str, bytes] = {
    "dt=2024-01-01/my.parquet": _parquet(tag="mine"),
    "part-mine.parquet": _parquet(tag="mine2"),
    ".backup/old.parquet": _parquet(tag="old"),
    "notes.csv": b"who,what\nme,notes\n",
    "charts/mine.png": b"my own picture",
}


def plant(folder: Path, files: Mapping[str, bytes]) -> dict[str, str]:
    """Write `files` below `folder`; returns their checksums."""
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return checksums(folder, files)


def checksums(folder: Path, names: Mapping[str, object] | None = None) -> dict[str, str]:
    """sha256 of each file (all files below `folder` when `names` is None)."""
    if names is None:
        rels = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    else:
        rels = list(names)
    out = {}
    for rel in sorted(rels):
        path = folder / rel
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "MISSING"
    return out


def assert_untouched(folder: Path, before: Mapping[str, str]) -> None:
    """Every file of `before` is still there, byte for byte."""
    assert checksums(folder, before) == dict(before)


def committed_files(out: Path) -> set[str]:
    """The part files ctxprec's commit records name (read straight from the records)."""
    records = (json.loads(p.read_text()) for p in (out / "_ctxprec" / "parts").glob("*.json"))
    return {f for record in records for f in record["files"]}


@contextmanager
def tmpfs(where: Path, size: str = "2m") -> Iterator[Path]:
    """A small tmpfs mounted at `where` (needs root and mount rights; raises OSError when the
    machine does not allow it). Unmounted on exit."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise OSError(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def remount(where: Path, mode: str) -> None:
    """`ro` or `rw`."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True)


def commit(outdir: Path, *parts: Path) -> None:
    """Commit records naming `parts`, as a run before part checks wrote them (files, rows):
    only recorded files are data. Each file is named `part-KEY.parquet` (in `col=value`
    folders); one record per KEY."""
    by_key: dict[str, list[str]] = {}
    for part in parts:
        rel = part.relative_to(outdir).as_posix()
        key = part.name.removeprefix("part-").removesuffix(".parquet")
        assert part.name == f"part-{key}.parquet", f"{rel}: not the name ctxprec gives a part"
        by_key.setdefault(key, []).append(rel)
    for key, files in by_key.items():
        rows = sum(pq.read_metadata(outdir / rel).num_rows for rel in files)
        record = {"key": key, "files": sorted(files), "rows": rows, "failed": 0}
        path = outdir / "_ctxprec" / "parts" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record), encoding="utf-8")
