"""`ctxprec cache info|clear [--older-than DURATION] [--old-format]`: see and manage the on-disk
memo that every run on this machine shares (never evicted by itself)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ctxprec.config import load_config, parse_duration
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files import layout
from ctxprec.storage.memo.database import check_folder
from ctxprec.storage.memo.store import Memo, default_cache_dir

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
    ca.add_argument(
        "--old-format",
        action="store_true",
        help="clear: only the verdicts older ctxprec versions stored in a memo format before v2 "
        "(never read now)",
    )


def _folder(args: argparse.Namespace) -> Path:
    """--cache-dir, else [run] cache_dir as the settings give it (CTXPREC_CACHE_DIR), else the
    user cache dir."""
    flags = {"run.cache_dir": args.cache_dir} if args.cache_dir else {}
    return load_config(None, flags).run.cache_dir or default_cache_dir()


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _info(folder: Path) -> str:
    if not layout.memo_db(folder).is_file():
        return f"ctxprec memo: {folder} (empty: no verdicts stored yet)"
    memo = Memo(folder)
    try:
        count, oldest, newest = memo.stats()
        notes = memo.notes()
    finally:
        memo.close()
    mib = _size(folder) / 2**20
    span = ""
    if oldest is not None and newest is not None:
        fmt = "%Y-%m-%d %H:%M"
        first, last = (time.strftime(fmt, time.localtime(t)) for t in (oldest, newest))
        span = f", stored {first} .. {last}"
    return "\n".join(
        [
            f"ctxprec memo: {folder}\n  {count:,} verdicts, {mib:,.1f} MiB{span}",
            *(f"  {note}" for note in notes),
            "  shared by every ctxprec run on this machine that uses this folder; never evicted: "
            "`ctxprec cache clear [--older-than 30d]` removes verdicts",
        ]
    )


def _clear(folder: Path, older_than: str | None, old_format: bool) -> str:
    if not layout.memo_db(folder).is_file():
        return f"ctxprec memo: {folder} holds no verdicts; nothing to clear"
    cutoff = time.time() - parse_duration(older_than, "--older-than") if older_than else None
    memo = Memo(folder)
    try:
        removed = memo.clear(cutoff, old_format)
        left = len(memo)
    finally:
        memo.close()
    kind = "verdicts of memo formats before v2" if old_format else "verdicts"
    return f"ctxprec memo: removed {removed:,} {kind} from {folder}; {left:,} left"


def run_cache_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    folder = _folder(args)
    check_folder(folder)  # nothing in it read or removed through a link or a planted entry
    if args.action == "info":
        if args.older_than or args.old_format:
            flag = "--older-than" if args.older_than else "--old-format"
            raise UserError(f"{flag} is for `ctxprec cache clear`")
        print(_info(folder))
    else:
        print(_clear(folder, args.older_than, args.old_format))
    return 0
