"""`ctxprec cache info|clear [--older-than DURATION] [--old-format] [--yes]`: see and manage the
on-disk memo that every run on this machine shares (never evicted by itself). `clear` says what
it would remove (verdicts, size, the tokens and money they took) and asks on a terminal; without
one it needs --yes."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ctxprec.config import Config, load_config, parse_duration
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.figures import counted, figure_text
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files import layout
from ctxprec.storage.memo.database import Tally, check_folder
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
    ca.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="clear: remove without asking (needed where there is no terminal to ask on)",
    )
    ca.add_argument(
        "--model",
        metavar="PROVIDER/MODEL",
        help="clear: price the verdicts' tokens at this judge's prices (default: [judge] model)",
    )


def _settings(args: argparse.Namespace) -> Config:
    """The settings the memo folder and the judge's prices come from: --cache-dir and --model,
    else the environment (CTXPREC_CACHE_DIR, CTXPREC_MODEL), else the defaults."""
    flags: dict[str, Any] = {"run.cache_dir": args.cache_dir} if args.cache_dir else {}
    if args.model:
        flags["judge.model"] = args.model
    return load_config(None, flags)


def _folder(cfg: Config) -> Path:
    """[run] cache_dir as the settings give it, else the user cache dir."""
    return cfg.run.cache_dir or default_cache_dir()


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


def _cost(tally: Tally, cfg: Config) -> str:
    """What the verdicts took: their tokens and, at the judge's prices, their money."""
    if not tally.input_tokens and not tally.output_tokens:
        return "which took no tokens (free verdicts, such as the offline judge's)"
    took = (
        f"which took {counted(tally.input_tokens, 'input token')} and "
        f"{counted(tally.output_tokens, 'output token')}"
    )
    model = cfg.judge.model
    price = None if model.startswith("offline") else cfg.price_for(model)
    if price is None:
        return f"{took} (--model PROVIDER/MODEL prices them)"
    usd = tally.input_tokens * price.input_per_mtok + tally.output_tokens * price.output_per_mtok
    return f"{took}, about ${figure_text(usd / 1e6)} at {model}'s prices"


def _confirmed(what: str, yes: bool) -> bool:
    """--yes, or a yes on the terminal; without a terminal to ask on, an error naming --yes."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UserError(
            f"`ctxprec cache clear` would remove {what}; nothing removed: there is no terminal "
            "to ask on, so confirm with --yes"
        )
    try:
        answer = input(f"ctxprec memo: remove {what}? [y/N] ")
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def _clear(folder: Path, args: argparse.Namespace, cfg: Config) -> str:
    if not layout.memo_db(folder).is_file():
        return f"ctxprec memo: {folder} holds no verdicts; nothing to clear"
    older_than, old_format = args.older_than, args.old_format
    cutoff = time.time() - parse_duration(older_than, "--older-than") if older_than else None
    kind = "verdicts of memo formats before v2" if old_format else "verdicts"
    memo = Memo(folder)
    try:
        if memo.read_only:  # nothing to ask: it refuses, saying why
            memo.clear(cutoff, old_format)
        tally = memo.tally(cutoff, old_format)
        age = f" stored more than {older_than} ago" if older_than else ""
        if not tally.rows:
            return f"ctxprec memo: {folder} holds no {kind}{age}; nothing to clear"
        what = (
            f"{tally.rows:,} {kind}{age} from {folder} ({tally.size / 2**20:,.1f} MiB), "
            f"{_cost(tally, cfg)}"
        )
        if not _confirmed(what, args.yes):
            return "ctxprec memo: nothing removed"
        removed = memo.clear(cutoff, old_format)
        left = len(memo)
    finally:
        memo.close()
    return f"ctxprec memo: removed {removed:,} {kind} from {folder}; {left:,} left"


def run_cache_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    cfg = _settings(args)
    folder = _folder(cfg)
    check_folder(folder)  # nothing in it read or removed through a link or a planted entry
    if args.action == "info":
        for flag, given in (
            ("--older-than", args.older_than),
            ("--old-format", args.old_format),
            ("--yes", args.yes),
            ("--model", args.model),
        ):
            if given:
                raise UserError(f"{flag} is for `ctxprec cache clear`")
        print(_info(folder))
    else:
        print(_clear(folder, args, cfg))
    return 0
