"""Things a user must be told about a run that is otherwise fine: no expected output (every item
judged against the query alone), an empty input, files of an input folder that were not read.
Each is one line; the CLI prints them and summary.md repeats them. Files in no input format are
also named on stderr as the input is checked. Both come from the one walk that found the input
files (`ctxprec.connectors.sources.files`)."""

from __future__ import annotations

from ctxprec.config import Config
from ctxprec.connectors.sources import SourceInfo
from ctxprec.flow.dispatch import RunCounters
from ctxprec.storage.core.figures import counted
from ctxprec.storage.memo.store import Memo, MemoStore
from ctxprec.storage.outdir.verdicts import SharedMemo

__all__ = [
    "OFFLINE_QUERY_ONLY",
    "memo_notices",
    "not_read_notice",
    "record_memo",
    "run_notices",
    "skipped_formats_line",
]

OFFLINE_QUERY_ONLY = (
    "the offline judge without an expected output is a weak heuristic: it finds passages whose "
    "subject the query names or that repeat the query's wording, and misses those that answer "
    "it in other words; fine for trying the pipeline, not for measuring a retriever"
)


def _no_expected(info: SourceInfo, cfg: Config) -> str | None:
    if info.has_expected:
        return None
    column = cfg.column_map.expected
    why = (
        "no expected output is mapped"
        if column is None
        else f"the input has no column `{column}` (map one with --map expected=COLUMN)"
    )
    line = (
        f"WARNING: {why}: every item is judged against the query alone, which usually marks "
        "fewer items relevant and gives lower scores than judging against an expected output"
    )
    if cfg.judge.model.startswith("offline"):
        line += f"; {OFFLINE_QUERY_ONLY}"
    return line


def skipped_formats_line(info: SourceInfo) -> str | None:
    """The line on stderr, as the input is checked, naming the files in no input format that
    were left out (of a glob or an object-store prefix). A local folder's are counted with its
    other files not read, in the run's one note on them (`not_read_notice`)."""
    if not info.skipped or info.not_read is not None:
        return None
    shown = ", ".join(info.skipped[:10])
    more = f", … ({len(info.skipped) - 10} more)" if len(info.skipped) > 10 else ""
    return (
        f"ctxprec: skipped {len(info.skipped)} file(s) in no input format (Parquet, JSON Lines, "
        f"CSV): {shown}{more}"
    )


def not_read_notice(info: SourceInfo) -> str | None:
    """One line on the files below a local input folder that were not read, by reason (from the
    walk that found the input files)."""
    nr = info.not_read
    if nr is None:
        return None
    counts = ", ".join(f"{n} {why}" for why, n in nr.reasons)
    examples = ", ".join(nr.examples)
    return f"note: {nr.total} file(s) in {nr.folder} were not read ({counts}; e.g. {examples})"


def run_notices(spec: str, info: SourceInfo, cfg: Config) -> list[str]:
    out = [_no_expected(info, cfg), not_read_notice(info), duplicates_notice(info)]
    if info.total_rows == 0:
        out.append(f"note: the input {spec} holds no rows; the output is an empty dataset")
    return [line for line in out if line]


def duplicates_notice(info: SourceInfo) -> str | None:
    """What a duplicate-ids policy dropped, in one line (the CLI, summary.md and summary.html
    show it; run.json and summary.json keep the counts under `duplicate_ids`)."""
    d = info.duplicates
    if d is None:
        return None
    which = "first" if d.policy == "keep-first" else "last"
    return (
        f"note: {counted(d.ids, 'id')} of the input repeated on several rows: the {which} row "
        f"of each was scored, {counted(d.rows, 'other row')} dropped (--duplicate-ids "
        f"{d.policy})"
    )


def record_memo(memo: MemoStore | None, counters: RunCounters) -> None:
    """What a run's memo has to say (read-only, unreadable entries, old ones) into its
    counters, once the memo is done with (an engine's tasks add theirs up)."""
    local = memo.local if isinstance(memo, SharedMemo) else memo
    if not isinstance(local, Memo):
        return
    counters.memo_unreadable += local.unreadable
    local.unreadable = 0  # (a memo recorded twice counts its entries once)
    counters.memo_notes.extend(n for n in local.notes() if n not in counters.memo_notes)


def memo_notices(counters: RunCounters) -> list[str]:
    """The memo's lines for the summary and the CLI, each once."""
    out = list(dict.fromkeys(counters.memo_notes))
    n = counters.memo_unreadable
    if n:
        out.append(
            f"memo: {n:,} {'entry' if n == 1 else 'entries'} could not be read as verdicts; "
            "judged again"
        )
    return out
