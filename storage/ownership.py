"""The one answer to "which files in OUTDIR are ctxprec's": the part files its commit records
name, the files it writes by fixed name (summary, charts, `_SUCCESS`) in a folder that holds its
manifest, its own state folder and its own temp files. Everything else is the user's: it is
never read as data, replaced or deleted. Report, dataset, run log and summary all ask here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from storage import layout
from storage.atomic import TMP_PREFIX, is_temp
from storage.core.errors import OutputError
from storage.layout import COMMITTED, PENDING
from storage.objpath import ObjPath, OutPath, out_path

__all__ = [
    "check_claimable",
    "foreign_files",
    "has_manifest",
    "local_outdir",
    "part_files",
    "read_manifest",
    "recorded_files",
    "records",
    "remove_owned",
    "remove_torn",
    "warn_foreign",
]


def local_outdir(outdir: str | OutPath) -> OutPath:
    """The output folder: a local path, or an object-store prefix (s3://, gs://, az://,
    abfs[s]://); other URLs are refused before anything is created (`storage.objpath`)."""
    return out_path(outdir)


def has_manifest(outdir: OutPath) -> bool:
    return layout.manifest(outdir).is_file()


def read_manifest(outdir: OutPath) -> dict[str, Any] | None:
    """The manifest, None when there is none; a damaged one is an OutputError."""
    path = layout.manifest(outdir)
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise OutputError(
            f"{path} is unreadable; the folder is damaged: use a new one or --overwrite"
        ) from None
    return data


def records(
    outdir: OutPath, prefix: str = "", suffix: str = COMMITTED
) -> dict[str, dict[str, Any]]:
    """Commit records (or pending records) by part key; a torn record is no record."""
    found: dict[str, dict[str, Any]] = {}
    folder = layout.parts_dir(outdir)
    if not folder.is_dir():
        return found
    children: list[OutPath] = list(folder.iterdir())
    for path in sorted(children, key=str):
        name = path.name
        if not (name.startswith(prefix) and name.endswith(suffix)) or is_temp(name):
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and "key" in raw and isinstance(raw.get("files"), list):
            found[str(raw["key"])] = raw
    return found


def named_files(record: dict[str, Any]) -> list[str]:
    """The files one record names, as paths relative to OUTDIR. An entry that is absolute or
    climbs out of OUTDIR (`..`) was not written by ctxprec and is never taken as ours."""
    out = []
    for entry in record["files"]:
        rel = PurePosixPath(str(entry))
        if not rel.is_absolute() and ".." not in rel.parts and rel.parts:
            out.append(rel.as_posix())
    return out


def recorded_files(outdir: OutPath, suffix: str = COMMITTED) -> set[str]:
    """Relative paths of the part files the records name."""
    return {f for raw in records(outdir, suffix=suffix).values() for f in named_files(raw)}


def part_files(outdir: OutPath) -> list[OutPath]:
    """The scored data of the folder: every part file a commit record names (and that exists).
    Parquet files anyone else put into the folder are not part of it."""
    found = (outdir / rel for rel in recorded_files(outdir))
    return sorted(p for p in found if p.is_file())


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
    for path in sorted(outdir.rglob("*")):
        rel = path.relative_to(outdir)
        if layout.in_state_dir(rel) or path.is_dir():
            continue
        yield rel.as_posix()


def foreign_files(outdir: OutPath) -> list[str]:
    """Files below `outdir` that ctxprec did not write (relative paths, sorted)."""
    ours = recorded_files(outdir) | recorded_files(outdir, PENDING) | _fixed(outdir)
    return [rel for rel in _walk(outdir) if rel not in ours and not is_temp(Path(rel).name)]


def check_claimable(outdir: OutPath) -> None:
    """A run may write into a folder that does not exist, is empty, holds only ctxprec's state
    (e.g. a saved estimate) or holds ctxprec's manifest; anything else is refused."""
    if outdir.exists() and not outdir.is_dir():
        raise OutputError(f"output {outdir} is a file, not a folder; pass a folder path")
    if not outdir.is_dir() or has_manifest(outdir):
        return
    found = []
    for rel in _walk(outdir):
        found.append(rel)
        if len(found) == 3:
            break
    if found:
        raise OutputError(
            f"output folder {outdir} holds files ctxprec did not write ({', '.join(found)}"
            f"{', ...' if len(found) == 3 else ''}); choose a new or empty folder"
        )


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
                _unlink(outdir / rel)
        _unlink(layout.pending_record(outdir, key))
    if outdir.is_dir():
        for tmp in outdir.rglob(f"{TMP_PREFIX}*"):
            if tmp.is_file() and is_temp(tmp.name):
                _unlink(tmp)


def remove_owned(outdir: OutPath) -> None:
    """--overwrite: remove exactly the files ctxprec's records name (parts, summary, charts,
    `_SUCCESS`, commit records, run state), and the folders that removing them left empty."""
    parts = recorded_files(outdir) | recorded_files(outdir, PENDING)
    for rel in sorted(parts | _fixed(outdir)):
        _unlink(outdir / rel)
        _prune(outdir, (outdir / rel).parent)
    parts_dir = layout.parts_dir(outdir)
    for path in parts_dir.glob("*") if parts_dir.is_dir() else []:
        if path.name.endswith((COMMITTED, PENDING)):
            _unlink(path)
    for path in layout.owned_state(outdir):
        _unlink(path)
    remove_torn(outdir)


def _unlink(path: OutPath) -> None:
    if path.is_file() or path.is_symlink():
        path.unlink(missing_ok=True)


def _prune(outdir: OutPath, folder: OutPath) -> None:
    """Remove `folder` and its parents up to `outdir` while they are empty."""
    if isinstance(outdir, ObjPath) or isinstance(folder, ObjPath):
        return  # an object store has no folders to leave behind
    while folder != outdir and outdir in folder.parents:
        with contextlib.suppress(OSError):
            folder.rmdir()  # fails (and stops) when the folder still holds anything
        if folder.exists():
            return
        folder = folder.parent
