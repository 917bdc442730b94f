"""Durable state of provider batches in OUTDIR/_ctxprec/batches/: one `state.json` (written
atomically) listing every chunk of requests with its stage and the provider's file and batch ids,
and per chunk the request lines (`<name>.jsonl`) and the custom_id -> memo keys map (`<name>.ids`).
The audit judge's batches (`--audit-model`) have a store of their own, the same files in
OUTDIR/_ctxprec/batches-audit/: the two judges' batches never mix.

A chunk's files and its state entry are written before anything is sent, the "intent" before the
batch is created, and the batch id as soon as the provider returns it; so a run killed at any
moment finds, on resume, every batch it created (or the intent to look one up).

Stages: written -> intent -> (uploaded) -> created -> collected.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write_text
from ctxprec.storage.outdir import statefile

__all__ = ["BatchStore", "ChunkWriter"]

# a chunk's request lines and id map, as `new_name` (and `_open`'s "x" suffixes) names them
_CHUNK_STEM = re.compile(r"c\d{8}T\d{6}-\d{5,}-r\d+-\d{4}x*")
_CHUNK_FILE = re.compile(rf"(?P<stem>{_CHUNK_STEM.pattern})\.(?:jsonl|ids)")
_IDS_LINE = re.compile(r"[^\t\n]+\t[0-9A-Za-z:_-]+(?: [0-9A-Za-z:_-]+)*")
_LIVE = ("written", "intent", "uploaded", "created")
_STAGES = (*_LIVE, "collected")

_CHUNK = {
    "name": "str", "round": "int", "lines": "int", "bytes": "int", "stage": "str",
    "written_at": "?num", "not_before": "?num", "file_id": "?str", "batch_id": "?str",
    "status": "?str", "answered": "?int", "error": "?str", "gen": "?int", "parent": "?str",
    "created_at": "?num", "intent_at": "?num", "ended_at": "?num", "results": "?int",
    "retried": "?int",
}  # fmt: skip
BATCH_STATE = statefile.Spec(
    {
        "version": "int",
        "chunks": {"*": _CHUNK},
        "failed": {"*": ["str"]},
        "finished": "bool",
        "gen": "int",
        "tokens": {"input": "int", "output": "int"},
        "model": "?str",
        "settings": statefile.opt({"*": "any"}),
    },
    required=("chunks",),
    cap=statefile.BATCH_STATE_CAP,
)


def _chunk_ok(name: str, chunk: dict[str, Any]) -> bool:
    """A chunk entry with what the batch run reads from it (`BATCH_STATE` has its types)."""
    needed = ("name", "round", "lines", "stage", "not_before")
    return (
        _CHUNK_STEM.fullmatch(name) is not None
        and all(chunk.get(k) is not None for k in needed)
        and chunk["name"] == name
        and chunk["stage"] in _STAGES
        and (chunk["stage"] in ("written", "collected") or chunk.get("intent_at") is not None)
    )


def _fix(outdir: Path, audit: bool = False) -> str:
    return (
        f"remove {layout.batches_dir(outdir, audit)} to start the provider batches over (batches "
        "already sent are then not collected: `ctxprec batches OUTDIR --cancel` first)"
    )


class BatchStore:
    """The state file and chunk files of one output folder; blocking I/O (call from a thread
    when inside the event loop, or accept the few ms it takes)."""

    def __init__(self, outdir: Path, audit: bool = False) -> None:
        self.outdir, self.audit = outdir, audit  # audit: the audit judge's batches
        self.dir = layout.batches_dir(outdir, audit)
        self.path = layout.batch_state(outdir, audit)
        self.fix = _fix(outdir, audit)
        self.data: dict[str, Any] = {"version": 1, "chunks": {}, "failed": {}, "finished": False}

    @classmethod
    def load(cls, outdir: Path, audit: bool = False) -> BatchStore:
        """The state of `outdir`'s batches (`audit`: the audit judge's), checked (a damaged one
        is a StateDamagedError)."""
        store = cls(outdir, audit)
        data = statefile.read_json(outdir, store.path, BATCH_STATE, store.fix)
        if data is not None:
            for name, chunk in data["chunks"].items():
                if not _chunk_ok(name, chunk):
                    why = f"chunk {name[:80]!r} is not one ctxprec writes"
                    raise statefile.damaged(store.path, why, store.fix)
            store.data = data
        return store

    def exists(self) -> bool:
        return self.path.is_file()

    def save(self) -> None:
        confine.check_inside(self.outdir, self.path)
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(self.data, indent=1, sort_keys=True))

    # -- chunks --------------------------------------------------------------------------
    @property
    def chunks(self) -> dict[str, dict[str, Any]]:
        chunks: dict[str, dict[str, Any]] = self.data.setdefault("chunks", {})
        return chunks

    @property
    def failed(self) -> dict[str, list[str]]:
        """memo key -> [cause, message] of items the batches could not answer."""
        failed: dict[str, list[str]] = self.data.setdefault("failed", {})
        return failed

    def live(self) -> list[dict[str, Any]]:
        """Chunks not yet collected, oldest first."""
        return sorted(
            (c for c in self.chunks.values() if c["stage"] in _LIVE), key=lambda c: c["name"]
        )

    def new_name(self, round_: int) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return f"c{stamp}-{len(self.chunks) + 1:05d}-r{round_}-{os.getpid() % 10000:04d}"

    def add(
        self, name: str, round_: int, lines: int, size: int, not_before: float = 0.0,
        parent: str | None = None,
    ) -> None:  # fmt: skip
        self.chunks[name] = {
            "name": name, "round": round_, "lines": lines, "bytes": size, "stage": "written",
            "written_at": time.time(), "not_before": not_before, "file_id": None,
            "batch_id": None, "status": None, "answered": 0, "error": None,
            "gen": int(self.data.get("gen", 0)), "parent": parent,
        }  # fmt: skip
        self.save()

    def update(self, name: str, **fields: Any) -> None:
        self.chunks[name].update(fields)
        self.save()

    def lines_path(self, name: str) -> Path:
        return layout.batch_file(self.outdir, name, ".jsonl", self.audit)

    def ids_path(self, name: str) -> Path:
        return layout.batch_file(self.outdir, name, ".ids", self.audit)

    def read_ids(self, name: str) -> dict[str, list[str]]:
        """custom_id -> memo keys of chunk `name`, checked line by line."""
        out: dict[str, list[str]] = {}
        path = self.ids_path(name)
        data = statefile.read_bytes(self.outdir, path, statefile.IDS_CAP, self.fix)
        try:
            text = (data or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise statefile.damaged(path, "not UTF-8 text", self.fix) from None
        for n, raw in enumerate(text.splitlines(), 1):
            custom_id, _, keys = raw.partition("\t")
            if not _IDS_LINE.fullmatch(raw):
                raise statefile.damaged(path, f"line {n} is not an id map", self.fix)
            out[custom_id] = keys.split(" ")
        return out

    def live_keys(self) -> set[str]:
        keys: set[str] = set()
        for chunk in self.live():
            for ks in self.read_ids(chunk["name"]).values():
                keys.update(ks)
        return keys

    def read_lines(self, name: str, wanted: set[str]) -> dict[str, dict[str, Any]]:
        """The request lines (parsed) of `wanted` custom ids in chunk `name`."""
        out: dict[str, dict[str, Any]] = {}
        path = self.lines_path(name)
        if not path.is_file():
            return out
        confine.check_inside(self.outdir, path)
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                try:
                    line = json.loads(raw)
                except (ValueError, RecursionError):
                    line = None
                if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
                    why = f"line {n} is not a request line"
                    raise statefile.damaged(path, why, self.fix) from None
                if line["custom_id"] in wanted:
                    out[line["custom_id"]] = line
        return out

    def drop_files(self, name: str) -> None:
        """A collected chunk's request lines are no longer needed (its id map stays)."""
        confine.unlink(self.outdir, self.lines_path(name))

    def remove_orphans(self) -> None:
        """Chunk files that no state entry names (a run killed while writing them)."""
        if not self.dir.is_dir():
            return
        known = set(self.chunks)
        for path in self.dir.iterdir():
            chunk = _CHUNK_FILE.fullmatch(path.name)
            if chunk is None or not path.is_file():
                continue  # state.json, or not a file ctxprec names: left alone
            if chunk["stem"] not in known:
                confine.unlink(self.outdir, path)


class ChunkWriter:
    """Writes request lines into chunk files within the limits; each finished chunk is
    registered in the store (stage "written") only once its files are complete on disk."""

    def __init__(
        self, store: BatchStore, round_: int, max_lines: int, max_bytes: int,
        not_before: float = 0.0, parent: str | None = None,
    ) -> None:  # fmt: skip
        self.store, self.round, self.parent = store, round_, parent
        self.max_lines, self.max_bytes = max_lines, max(1, max_bytes - 4096)  # room for framing
        self.not_before = not_before
        self.names: list[str] = []
        self._name: str | None = None
        self._lines: Any = None
        self._ids: Any = None
        self._count = 0
        self._size = 0

    def add(self, custom_id: str, keys: Iterable[str], line: bytes) -> None:
        if self._name is not None and (
            self._count >= self.max_lines or self._size + len(line) + 1 > self.max_bytes
        ):
            self._close()
        if self._name is None:
            self._open()
        self._lines.write(line)
        self._ids.write(f"{custom_id}\t{' '.join(keys)}\n")
        self._count += 1
        self._size += len(line) + 1

    def _open(self) -> None:
        self.store.dir.mkdir(parents=True, exist_ok=True)
        name = self.store.new_name(self.round)
        while name in self.store.chunks or name in self.names:
            name += "x"
        self._name = name
        self._lines = self.store.lines_path(name).open("wb")
        self._ids = self.store.ids_path(name).open("w", encoding="utf-8")
        self._count = self._size = 0

    def _close(self) -> None:
        assert self._name is not None
        for fh in (self._lines, self._ids):
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        self.store.add(
            self._name, self.round, self._count, self._size, self.not_before, self.parent
        )
        self.names.append(self._name)
        self._name = None

    def close(self) -> list[str]:
        if self._name is not None:
            self._close()
        return self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)
