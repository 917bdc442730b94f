"""The one answer to "which files in OUTDIR are ctxprec's": the part files its commit records
name, the files it writes by fixed name (summary, charts, `_SUCCESS`) in a folder that holds its
manifest, its own state folder and its own temp files. Everything else is the user's: it is
never read as data, replaced or deleted. Report, dataset, run log and summary all ask here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import OutputError, StateDamagedError
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import TMP_PREFIX, is_temp
from ctxprec.storage.files.layout import COMMITTED, PENDING
from ctxprec.storage.files.objpath import ObjPath, OutPath
from ctxprec.storage.outdir import partcheck, statefile

__all__ = [
    "check_claimable",
    "drop_incomplete",
    "foreign_files",
    "has_manifest",
    "incomplete_parts",
    "missing_rows_line",
    "named_files",
    "part_files",
    "read_manifest",
    "recorded_files",
    "records",
    "remove_owned",
    "remove_torn",
    "warn_foreign",
]


def has_manifest(outdir: OutPath) -> bool:
    return confine.is_regular(layout.manifest(outdir))


_STATE_FIX = "remove it to start over, or use --overwrite"


def read_manifest(outdir: OutPath) -> dict[str, Any] | None:
    """The manifest, None when there is none; a damaged one is an OutputError."""
    path = layout.manifest(outdir)
    data: dict[str, Any] | None = statefile.read_json(outdir, path, statefile.MANIFEST, _STATE_FIX)
    return data


def _record_fix(key: str) -> str:
    return (
        f"remove it and the files part-{key}.parquet it named (their rows are then scored "
        "again), or use --overwrite"
    )


def _not_ours(path: OutPath, entry: object) -> OutputError:
    return OutputError(
        f"{path} names {str(entry)[:200]!r}, which is not a file ctxprec writes there "
        "(part-KEY.parquet, in col=value folders, for the record's own KEY); nothing was "
        "changed: someone else wrote this record; remove it and check the folder"
    )


def _read_record(outdir: OutPath, path: OutPath, key: str, suffix: str) -> dict[str, Any]:
    """One record, checked: its schema, its key (its file name), and every file it names is
    one of part KEY's and lies in OUTDIR through no link. Raises OutputError."""
    spec = statefile.COMMIT_RECORD if suffix == COMMITTED else statefile.RECORD
    raw: dict[str, Any] = statefile.read_json(outdir, path, spec, _record_fix(key))
    if raw["key"] != key:
        raise statefile.damaged(path, "its key is not its file name", _record_fix(key))
    if suffix == COMMITTED and raw["failed"] > raw["rows"]:
        raise statefile.damaged(path, "more failed rows than rows", _record_fix(key))
    if suffix == COMMITTED and raw["rows"] and not raw["files"]:
        raise statefile.damaged(path, f"{raw['rows']} rows in no file", _record_fix(key))
    for entry in raw["files"]:
        if not layout.is_part_file(entry, key):
            raise _not_ours(path, entry)
        try:
            confine.check_inside(outdir, outdir / entry)
        except OutputError as exc:
            raise OutputError(f"{path} names a file behind a link: {exc}") from None
        named = outdir / entry
        if not confine.is_regular(named) and (named.exists() or named.is_symlink()):
            raise OutputError(
                f"{path} names {named}, which is not a regular file (a folder?); nothing was "
                f"changed: move it out of {outdir}, or use a new output folder"
            )
    return raw


def _record_paths(outdir: OutPath, prefix: str, suffix: str) -> Iterator[tuple[str, OutPath]]:
    """(key, path) of each record file of ctxprec's naming in the parts folder."""
    folder = layout.parts_dir(outdir)
    confine.check_inside(outdir, folder)
    if not folder.is_dir():
        return
    children: list[OutPath] = list(folder.iterdir())
    for path in sorted(children, key=str):
        name = path.name
        if not (name.startswith(prefix) and name.endswith(suffix)) or is_temp(name):
            continue
        key = name.removesuffix(suffix)
        if layout.is_part_key(key):
            yield key, path


def records(
    outdir: OutPath, prefix: str = "", suffix: str = COMMITTED
) -> dict[str, dict[str, Any]]:
    """Commit records (or pending records) by part key, each checked (`_read_record`): a
    damaged one, or one naming a file that is not ctxprec's, is an OutputError naming it."""
    return {
        key: _read_record(outdir, path, key, suffix)
        for key, path in _record_paths(outdir, prefix, suffix)
    }


def _damaged_records(outdir: OutPath) -> list[tuple[str, OutPath]]:
    """--overwrite: the records too damaged to read (not JSON, wrong types); a record that
    reads but names a file that is not ctxprec's is still an OutputError."""
    found = []
    for suffix in (COMMITTED, PENDING):
        for key, path in _record_paths(outdir, "", suffix):
            try:
                _read_record(outdir, path, key, suffix)
            except StateDamagedError:
                found.append((key, path))
    return found


def named_files(record: dict[str, Any]) -> list[str]:
    """The files one (checked) record names, as paths relative to OUTDIR."""
    key = str(record.get("key"))
    return [str(e) for e in record.get("files", []) if layout.is_part_file(str(e), key)]


def recorded_files(outdir: OutPath, suffix: str = COMMITTED) -> set[str]:
    """Relative paths of the part files the records name."""
    return {f for raw in records(outdir, suffix=suffix).values() for f in named_files(raw)}


def part_files(outdir: OutPath, without: Collection[str] = ()) -> list[OutPath]:
    """The scored data of the folder: every part file a commit record names (and that exists),
    but those of the parts whose keys are in `without` (parts `incomplete_parts` found). Parquet
    files anyone else put into the folder are not part of it."""
    rels = {
        f for key, raw in records(outdir).items() if key not in without for f in named_files(raw)
    }
    found = (outdir / rel for rel in rels)
    return sorted(p for p in found if p.is_file())


def incomplete_parts(outdir: OutPath) -> dict[str, list[tuple[str, str]]]:
    """Committed parts some of whose files are gone or are not what their record says
    (`ctxprec.storage.outdir.partcheck`): key -> [(file, what is wrong)]. Reads every part file
    once (its CRC): call it once per command, before the parts are trusted."""
    found: dict[str, list[tuple[str, str]]] = {}
    for key, raw in records(outdir).items():
        problems = partcheck.record_problems(outdir, raw)
        if problems:
            found[key] = problems
    return found


def missing_rows_line(outdir: OutPath, incomplete: dict[str, list[tuple[str, str]]]) -> str:
    """What the incomplete parts lost, in one line: files, the first of them (and what is wrong
    with it when it is there but damaged), rows."""
    done = records(outdir)
    rows = sum(int(done[key]["rows"]) for key in incomplete if key in done)
    problems = [problem for found in incomplete.values() for problem in found]
    first, why = problems[0]
    damaged = any(why != partcheck.MISSING for _, why in problems)
    shown = f"{outdir / first}: {why}" if why != partcheck.MISSING else str(outdir / first)
    return (
        f"{len(problems)} part file(s) that commit records in {layout.parts_dir(outdir)} name are "
        f"{'missing or damaged' if damaged else 'missing'} (first: {shown}), with {rows} row(s)"
    )


def drop_incomplete(outdir: OutPath, incomplete: dict[str, list[tuple[str, str]]]) -> None:
    """The commit records (and their remaining files) of the parts `incomplete_parts` found,
    so that a run scores their rows again."""
    done = records(outdir)
    for key in incomplete:
        if key not in done:
            continue
        for rel in named_files(done[key]):
            confine.unlink(outdir, outdir / rel)
        confine.unlink(outdir, layout.commit_record(outdir, key))


def _fixed(outdir: OutPath) -> set[str]:
    """Files ctxprec writes by fixed name, ours only in a folder that holds its manifest."""
    if not has_manifest(outdir):
        return set()
    return layout.fixed_files()


def _walk(outdir: OutPath) -> Iterator[str]:
    """Every file below `outdir` (hidden ones too), as a relative path; not the state folder."""
    if isinstance(outdir, ObjPath):  # rglob lists files only, in one listing
        for obj in sorted(outdir.rglob("*")):
            key = obj.relative_to(outdir)
            if not layout.in_state_dir(key):
                yield key.as_posix()
        return
    if not outdir.is_dir():
        return
    found: list[str] = []
    for folder, dirs, names in os.walk(outdir):  # links are listed, never followed
        here = Path(folder).relative_to(outdir)
        if here == Path(".") and layout.STATE_DIR in dirs:
            dirs.remove(layout.STATE_DIR)
        found.extend((here / name).as_posix() for name in names)
        found.extend((here / d).as_posix() for d in dirs if (Path(folder) / d).is_symlink())
    yield from sorted(found)


def foreign_files(outdir: OutPath) -> list[str]:
    """Files below `outdir` that ctxprec did not write (relative paths, sorted)."""
    ours = recorded_files(outdir) | recorded_files(outdir, PENDING) | _fixed(outdir)
    return [rel for rel in _walk(outdir) if rel not in ours and not is_temp(Path(rel).name)]


def check_claimable(outdir: OutPath) -> None:
    """A run may write into a folder that does not exist, is empty, holds only ctxprec's state
    (e.g. a saved estimate) or holds ctxprec's manifest; anything else is refused."""
    if outdir.exists() and not outdir.is_dir():
        raise OutputError(f"output {outdir} is a file, not a folder; pass a folder path")
    if not outdir.is_dir():
        return
    confine.check_inside(outdir, layout.state_dir(outdir))  # a link there: named first
    found = []
    for rel in _walk(outdir) if not has_manifest(outdir) else ():
        found.append(rel)
        if len(found) == 3:
            break
    if found:
        raise OutputError(
            f"output folder {outdir} holds files ctxprec did not write ({', '.join(found)}"
            f"{', ...' if len(found) == 3 else ''}); choose a new or empty folder"
        )
    confine.check_tree(outdir)  # no link where ctxprec reads or writes its own files


def warn_foreign(outdir: OutPath) -> str | None:
    """One warning line when a ctxprec folder also holds the user's files, else None."""
    foreign = foreign_files(outdir)
    if not foreign:
        return None
    shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    return (
        f"ctxprec: warning: {outdir} holds {len(foreign)} file(s) ctxprec did not write "
        f"({shown}); they are left as they are and not read as scored rows"
    )


def remove_torn(outdir: OutPath) -> None:
    """Files of parts whose writing was cut off (named by a pending record only), the pending
    records themselves and ctxprec's temp files: left by a killed run (removed before the next)
    or by a worker killed during this one (removed before the run is marked finished)."""
    pending = records(outdir, suffix=PENDING)
    committed = recorded_files(outdir) if pending else set()
    for key, raw in pending.items():
        for rel in named_files(raw):
            if rel not in committed:
                confine.unlink(outdir, outdir / rel)
        confine.unlink(outdir, layout.pending_record(outdir, key))
    for tmp in _temp_files(outdir):
        confine.unlink(outdir, tmp)


def _temp_files(outdir: OutPath) -> list[OutPath]:
    """ctxprec's temp files below `outdir`, found through no link."""
    if isinstance(outdir, ObjPath):
        return [p for p in outdir.rglob(f"{TMP_PREFIX}*") if is_temp(p.name)]
    found: list[OutPath] = []
    for folder, _, names in os.walk(outdir):  # never into a linked folder
        found.extend(Path(folder) / n for n in names if is_temp(n))
    return found


def remove_owned(outdir: OutPath) -> None:
    """--overwrite: remove exactly the files ctxprec's records name (parts, summary, charts,
    `_SUCCESS`, commit records, run state), and the folders that removing them left empty.
    Records too damaged to read go with the files of their key (part-KEY.parquet); every
    record and path is checked before the first file is removed."""
    confine.check_tree(outdir)
    damaged = _damaged_records(outdir)
    parts = recorded_files(outdir) | recorded_files(outdir, PENDING)
    lost_keys = {key for key, _ in damaged}
    if lost_keys:
        parts |= {rel for rel in _walk(outdir) if _part_key_of(rel) in lost_keys}
    for rel in sorted(parts | _fixed(outdir)):
        confine.unlink(outdir, outdir / rel)
        _prune(outdir, (outdir / rel).parent)
    for _, path in damaged:
        confine.unlink(outdir, path)
    for suffix in (COMMITTED, PENDING):
        for _, path in _record_paths(outdir, "", suffix):
            confine.unlink(outdir, path)
    for path in layout.owned_state(outdir):
        confine.unlink(outdir, path)
    remove_torn(outdir)


def _part_key_of(rel: str) -> str | None:
    """The key of the part file `rel` would be, if it is of ctxprec's naming."""
    name = rel.rsplit("/", 1)[-1]
    key = name.removeprefix(layout.part_name("")).removesuffix(".parquet")
    return key if layout.is_part_file(rel, key) else None


def _prune(outdir: OutPath, folder: OutPath) -> None:
    """Remove `folder` and its parents up to `outdir` while they are empty."""
    if isinstance(outdir, ObjPath) or isinstance(folder, ObjPath):
        return  # an object store has no folders to leave behind
    while folder != outdir and outdir in folder.parents:
        if folder.is_symlink():
            return
        with contextlib.suppress(OSError):
            folder.rmdir()  # fails (and stops) when the folder still holds anything
        if folder.exists():
            return
        folder = folder.parent
