"""Every path ctxprec reads back, writes, renames or deletes in an output folder stays inside
the real OUTDIR: no component below OUTDIR may be a symbolic link (each checked with lstat just
before the change), and nothing climbs out with `..`. OUTDIR itself, as the command line names
it, is trusted, links above it included. Object stores have no links: only the prefix is checked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "check_inside",
    "check_tree",
    "dangerous_outdir",
    "is_regular",
    "relative",
    "unlink",
]


def relative(outdir: OutPath, path: OutPath) -> PurePosixPath:
    """`path` relative to `outdir`, refused unless it lies below it (lexically)."""
    try:
        rel = PurePosixPath(path.relative_to(outdir).as_posix())  # type: ignore[arg-type]
    except ValueError:
        msg = f"{path} lies outside the output folder {outdir}; nothing was changed"
        raise OutputError(msg) from None
    if ".." in rel.parts or rel.is_absolute():
        raise OutputError(f"{path} climbs out of the output folder {outdir}; nothing was changed")
    return rel


def _link_error(outdir: OutPath, link: OutPath) -> OutputError:
    return OutputError(
        f"{link} is a symbolic link; ctxprec reads, writes and deletes nothing through a link "
        f"in an output folder (it may lead outside {outdir}), so nothing was changed: remove "
        "the link (its target is untouched) or use a new output folder"
    )


def check_inside(outdir: OutPath, path: OutPath) -> OutPath:
    """`path`, once checked: below `outdir`, and no component below `outdir` (the last one
    included) is a symbolic link. Components that do not exist yet are fine: ctxprec creates
    them as real folders. Raises OutputError naming the link."""
    rel = relative(outdir, path)
    if isinstance(outdir, ObjPath):
        return path
    here = Path(outdir)
    for part in rel.parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return path
        except OSError as exc:
            raise OutputError(f"cannot inspect {here}: {exc.strerror}") from exc
        if stat.S_ISLNK(mode):
            raise _link_error(outdir, here)
    return path


def is_regular(path: OutPath) -> bool:
    """A regular file, not followed if it is a link (an object in an object store)."""
    if isinstance(path, ObjPath):
        return path.is_file()
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def unlink(outdir: OutPath, path: OutPath) -> None:
    """Delete `path` if it is a regular file below `outdir` reached through no link."""
    check_inside(outdir, path)
    if is_regular(path):
        path.unlink(missing_ok=True)


def _fixed_paths(outdir: Path) -> Iterable[Path]:
    """The folders and fixed-name files ctxprec writes in OUTDIR, and the entries of its own
    state folders (records, verdict folders, batch files)."""
    state = layout.state_dir(outdir)
    yield state
    yield from (outdir / rel for rel in sorted(layout.fixed_files()))
    yield layout.charts_dir(outdir)
    yield from layout.owned_state(outdir)
    yield layout.lock(outdir)
    for folder in (
        layout.parts_dir(outdir),
        layout.batches_dir(outdir),
        layout.batches_dir(outdir, audit=True),
        layout.verdicts_root(outdir),
        layout.key_shards(outdir),
        layout.shuffle_root(outdir),
        layout.batch_memo(outdir),
    ):
        yield folder
        if folder.is_dir() and not folder.is_symlink():
            yield from sorted(folder.iterdir())


def check_tree(outdir: OutPath) -> None:
    """Before a run (or a command that writes) changes anything: none of the paths ctxprec
    uses in `outdir` is a link. Raises OutputError naming the first one found."""
    if isinstance(outdir, ObjPath) or not Path(outdir).is_dir():
        return
    for path in _fixed_paths(Path(outdir)):
        check_inside(outdir, path)


def dangerous_outdir(outdir: OutPath, home: Path | None = None) -> str | None:
    """Why `outdir` must never be replaced by --overwrite (the file system root, the home
    folder, the working folder or one of its parents), or None."""
    if isinstance(outdir, ObjPath):
        return None
    real = Path(os.path.realpath(outdir))
    home = home if home is not None else Path.home()
    cwd = Path(os.path.realpath(os.getcwd()))
    if real == Path(real.anchor):
        return "the root of the file system"
    if real == Path(os.path.realpath(home)):
        return "your home folder"
    if real == cwd or real in cwd.parents:
        return "the working folder or one of its parents"
    return None
