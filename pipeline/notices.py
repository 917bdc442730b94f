"""Things a user must be told about a run that is otherwise fine: no expected output (every item
judged against the query alone), an empty input, files of an input folder that were not read.
Each is one line; the CLI prints them and summary.md repeats them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from connectors.sources import SourceInfo
from connectors.sources.files import InputFile, detect_format
from pipeline.config import Config

__all__ = ["OFFLINE_QUERY_ONLY", "run_notices", "skipped_files_notice"]

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


def skipped_files_notice(spec: str, read: tuple[InputFile, ...]) -> str | None:
    """One line on the files below a local input folder that were not read, by reason."""
    root = Path(spec)
    if not root.is_dir():
        return None
    taken = {Path(f.path).resolve() for f in read if not f.remote}
    reasons: Counter[str] = Counter()
    examples: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.resolve() in taken:
            continue
        rel = path.relative_to(root)
        if any(p.startswith(("_", ".")) for p in rel.parts):
            reasons["hidden or starting with '_'"] += 1
        elif detect_format(path.name) is None:
            reasons["in no input format (Parquet, JSON Lines, CSV)"] += 1
        else:
            reasons["inside a ctxprec output folder"] += 1
        if len(examples) < 3:
            examples.append(str(rel))
    if not reasons:
        return None
    counts = ", ".join(f"{n} {why}" for why, n in reasons.items())
    total = sum(reasons.values())
    return f"note: {total} file(s) in {root} were not read ({counts}; e.g. {', '.join(examples)})"


def run_notices(spec: str, info: SourceInfo, cfg: Config) -> list[str]:
    out = [_no_expected(info, cfg), skipped_files_notice(spec, info.files)]
    if info.total_rows == 0:
        out.append(f"note: the input {spec} holds no rows; the output is an empty dataset")
    return [line for line in out if line]
