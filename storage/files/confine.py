"""Every path ctxprec reads back, writes, renames or deletes in an output folder stays inside
the real OUTDIR: no component below OUTDIR may be a symbolic link (each checked with lstat just
before the change), and nothing climbs out with `..`. OUTDIR itself, as the command line names
it, is trusted, links above it included. Object stores have no links: only the prefix is checked.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import is_temp
from ctxprec.storage.files.kinds import kind_problem
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "check_inside",
    "check_tree",
    "dangerous_outdir",
    "is_regular",
    "read_regular",
    "relative",
    "tree_problems",
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


def _first_link(outdir: OutPath, path: OutPath) -> Path | None:
    """The first component of `path` below `outdir` (the last one included) that is a
    symbolic link, or None; `path` must lie below `outdir` (OutputError otherwise)."""
    rel = relative(outdir, path)
    if isinstance(outdir, ObjPath):
        return None
    here = Path(outdir)
    for part in rel.parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OutputError(f"cannot inspect {here}: {exc.strerror}") from exc
        if stat.S_ISLNK(mode):
            return here
    return None


def check_inside(outdir: OutPath, path: OutPath) -> OutPath:
    """`path`, once checked: below `outdir`, and no component below `outdir` (the last one
    included) is a symbolic link. Components that do not exist yet are fine: ctxprec creates
    them as real folders. Raises OutputError naming the link."""
    link = _first_link(outdir, path)
    if link is not None:
        raise _link_error(outdir, link)
    return path


def is_regular(path: OutPath) -> bool:
    """A regular file, not followed if it is a link (an object in an object store)."""
    if isinstance(path, ObjPath):
        return path.is_file()
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_regular(path: Path, cap: int) -> bytes | None:
    """The bytes of the regular file `path` (None when there is none), opened without following
    a link in its last component and without blocking (a FIFO put in its place), checked on
    the open file, never read past `cap` bytes. Raises ValueError saying why the file is not one
    to read (a symbolic link, not a regular file, larger than the cap); OSError as reading may."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        too_big = f"larger than {cap >> 20} MiB" if cap >= 1 << 20 else f"over {cap:,} bytes"
        if info.st_size > cap:
            raise ValueError(too_big)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise ValueError(too_big)
    return data


def unlink(outdir: OutPath, path: OutPath) -> None:
    """Delete `path` if it is a regular file below `outdir` reached through no link."""
    check_inside(outdir, path)
    if is_regular(path):
        path.unlink(missing_ok=True)


_FILE, _FOLDER, _ANY = "file", "folder", "any"


def _fixed_paths(outdir: Path) -> Iterable[tuple[Path, str]]:
    """The folders and fixed-name files ctxprec writes in OUTDIR, and the entries of its own
    state folders (records, verdict folders, batch files), each with the kind it must be."""
    state = layout.state_dir(outdir)
    yield state, _FOLDER
    yield from ((outdir / rel, _FILE) for rel in sorted(layout.fixed_files()))
    yield layout.charts_dir(outdir), _FOLDER
    yield from ((path, _FILE) for path in layout.owned_state(outdir))
    yield layout.lock(outdir), _FILE
    for folder in (
        layout.parts_dir(outdir),
        layout.batches_dir(outdir),
        layout.batches_dir(outdir, audit=True),
        layout.verdicts_root(outdir),
        layout.key_shards(outdir),
        layout.shuffle_root(outdir),
        layout.batch_memo(outdir),
    ):
        yield folder, _FOLDER
        if folder.is_dir() and not folder.is_symlink():
            yield from ((child, _ANY) for child in sorted(folder.iterdir()))


def _temp_links(outdir: Path) -> Iterable[Path]:
    """ctxprec's temp file names anywhere below `outdir` that are links: a run removes its temp
    files, so such a link must stop it before anything changes (never followed)."""
    for folder, dirs, names in os.walk(outdir):  # links are listed, never followed
        for name in (*names, *dirs):
            path = Path(folder) / name
            if is_temp(name) and path.is_symlink():
                yield path


def tree_problems(outdir: OutPath) -> list[tuple[Path, str]]:
    """Every problem with the paths ctxprec reads, writes or deletes in `outdir`, in words: a
    symbolic link on the way to one (its state folders, fixed-name files, temp files anywhere
    below), or a fixed path of the wrong kind (`_SUCCESS` a folder, `_ctxprec/parts` a file)."""
    if isinstance(outdir, ObjPath) or not Path(outdir).is_dir():
        return []
    found: dict[Path, str] = {}
    for path, kind in _fixed_paths(Path(outdir)):
        link = _first_link(outdir, path)
        if link is not None:
            found.setdefault(link, str(_link_error(outdir, link)))
        elif kind != _ANY and (what := kind_problem(path, kind == _FOLDER)) is not None:
            found.setdefault(path, _kind_error(outdir, path, what))
    for link in _temp_links(Path(outdir)):
        found.setdefault(link, str(_link_error(outdir, link)))
    return list(found.items())


def _kind_error(outdir: OutPath, path: Path, what: str) -> str:
    return (
        f"{path} is {what}, where ctxprec writes its own; nothing was changed: move it out of "
        f"{outdir} or use a new output folder"
    )


def check_tree(outdir: OutPath) -> None:
    """Before a run (or a command that writes) changes anything: every path ctxprec uses in
    `outdir` is checked (`tree_problems`), and any problem found stops it in one line naming the
    first and how many more there are: nothing has been changed then."""
    problems = tree_problems(outdir)
    if not problems:
        return
    first, more = problems[0][1], [str(path) for path, _ in problems[1:]]
    if more:
        shown = ", ".join(more[:3]) + (", ..." if len(more) > 3 else "")
        first += f" (and {len(more)} more path(s) to fix: {shown})"
    raise OutputError(first)


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
