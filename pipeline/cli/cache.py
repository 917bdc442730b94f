"""`ctxprec cache info|clear [--older-than DURATION]`: see and manage the on-disk memo that every
run on this machine shares (never evicted by itself)."""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path
from typing import Any

from pipeline.config import load_config, parse_duration
from storage import layout
from storage.core.errors import UserError
from storage.memo import default_cache_dir

__all__ = ["add_cache_command", "run_cache_command"]


def add_cache_command(sub: Any) -> None:
    ca = sub.add_parser("cache", help="show or clear the memo of judge verdicts")
    ca.add_argument("action", choices=["info", "clear"], help="info: where and how big; clear")
    ca.add_argument(
        "--cache-dir", help="memo folder (default: CTXPREC_CACHE_DIR or the user cache dir)"
    )
    ca.add_argument(
        "--older-than",
        metavar="DURATION",
        help="clear: only verdicts stored longer ago than this, e.g. 30d, 12h, 2w (default: all)",
    )


def _folder(args: argparse.Namespace) -> Path:
    """--cache-dir, else [run] cache_dir as the settings give it (CTXPREC_CACHE_DIR), else the
    user cache dir."""
    flags = {"run.cache_dir": args.cache_dir} if args.cache_dir else {}
    return load_config(None, flags).run.cache_dir or default_cache_dir()


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _store_times(folder: Path) -> list[tuple[Any, float]]:
    db = layout.memo_db(folder)
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return [(k, float(t or 0)) for k, t in con.execute("SELECT key, store_time FROM Cache")]


def _info(folder: Path) -> str:
    if not layout.memo_db(folder).is_file():
        return f"ctxprec memo: {folder} (empty: no verdicts stored yet)"
    times = [t for _, t in _store_times(folder)]
    mib = _size(folder) / 2**20
    span = ""
    if times:
        fmt = "%Y-%m-%d %H:%M"
        oldest, newest = (time.strftime(fmt, time.localtime(t)) for t in (min(times), max(times)))
        span = f", stored {oldest} .. {newest}"
    return (
        f"ctxprec memo: {folder}\n  {len(times):,} verdicts, {mib:,.1f} MiB{span}\n"
        "  shared by every ctxprec run on this machine that uses this folder; never evicted: "
        "`ctxprec cache clear [--older-than 30d]` removes verdicts"
    )


def _clear(folder: Path, older_than: str | None) -> str:
    if not layout.memo_db(folder).is_file():
        return f"ctxprec memo: {folder} holds no verdicts; nothing to clear"
    import diskcache

    cutoff = time.time() - parse_duration(older_than, "--older-than") if older_than else None
    with diskcache.Cache(str(folder), eviction_policy="none") as cache:
        if cutoff is None:
            removed = cache.clear()
        else:
            old = [k for k, t in _store_times(folder) if t < cutoff]
            removed = sum(1 for k in old if cache.delete(k))
        left = len(cache)
    return f"ctxprec memo: removed {removed:,} verdicts from {folder}; {left:,} left"


def run_cache_command(args: argparse.Namespace) -> int:
    folder = _folder(args)
    if args.action == "info":
        if args.older_than:
            raise UserError("--older-than is for `ctxprec cache clear`")
        print(_info(folder))
    else:
        print(_clear(folder, args.older_than))
    return 0
