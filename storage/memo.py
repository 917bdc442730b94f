"""On-disk verdict memo (diskcache) and its key recipe.

A key is a tagged SHA-256 over everything that changes a verdict: the judge's identity
(provider, model, base URL, decoding), the prompt version, query, expected output and item.
Entries are never evicted (eviction_policy "none"): a verdict once paid for stays.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import platformdirs

from storage.core.errors import OutputError

__all__ = [
    "MEMO_RECIPE",
    "Memo",
    "MemoEntry",
    "MemoStore",
    "default_cache_dir",
    "judge_prefix",
    "memo_key",
]

MEMO_RECIPE = "ctxprec-memo-v1"  # change when the recipe below changes

# (relevant, reason, input_tokens, output_tokens)
MemoEntry = tuple[bool, str, int, int]


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


def memo_key(
    prefix: bytes, prompt_version: str, query: str, expected: str | None, item: str
) -> str:
    h = hashlib.sha256(prefix)
    for part in (prompt_version, query, expected, item):
        h.update(_field(part))
    return "v1-" + h.hexdigest()


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


class Memo:
    """A thin wrapper over diskcache.Cache; call its methods from a worker thread."""

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
        except (OSError, sqlite3.Error) as exc:
            raise _write_failed(directory, exc) from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, MemoEntry]:
        # plain reads, no transaction: in WAL mode they never wait for the memo writer
        # (a `transact()` here would take SQLite's write lock and stall behind every write)
        found: dict[str, MemoEntry] = {}
        get = self._cache.get
        for key in keys:
            value = get(key)
            if value is not None:
                found[key] = value
        return found

    def set_many(self, entries: Iterable[tuple[str, MemoEntry]]) -> int:
        """Store verdicts in one transaction: on a full disk none of them is kept."""
        n = 0
        cache = self._cache
        try:
            with cache.transact():
                for key, value in entries:
                    cache.set(key, value)
                    n += 1
        except (OSError, sqlite3.Error) as exc:
            raise _write_failed(self.directory, exc) from exc
        return n

    def __len__(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        self._cache.close()
