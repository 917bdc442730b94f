"""The one way ctxprec writes a file: a temp file of its own naming pattern beside the target,
fsynced, renamed over the target, then the folder fsynced. In an object store (`ObjPath`), which
has no rename, the file is made in a local temp file and sent as one PUT under its final name:
readers see the old object or the new one, whole. A failed write (full disk, read-only folder)
leaves no temp file behind and raises `OutputError` saying what to do next.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "TMP_PREFIX",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "is_temp",
    "temp_path",
    "write_error",
]

TMP_PREFIX = ".ctxprec-tmp-"  # only files named so are ctxprec's temp files

_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def is_temp(name: str) -> bool:
    """A temp file of ctxprec's own naming pattern (never a user's file)."""
    return name.startswith(TMP_PREFIX)


def temp_path(target: Path) -> Path:
    """A unique temp file beside `target`."""
    return target.with_name(f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{target.name}")


def write_error(target: OutPath, exc: OSError) -> OutputError:
    """The user-facing error for a write that failed."""
    reason = _REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    return OutputError(
        f"cannot write {target}: {reason}; nothing half-written was kept: free some space "
        "(or make the folder writable) and run the same command again to finish"
    )


def atomic_write(target: OutPath, write: Callable[[Path], object]) -> None:
    """`write(tmp)` fills a temp file; it then replaces `target` in one rename (one PUT in an
    object store)."""
    if not isinstance(target, Path):
        _put(target, write)
        return
    tmp = temp_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise write_error(target, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    _fsync_folder(target.parent)


def _put(target: OutPath, write: Callable[[Path], object]) -> None:
    assert isinstance(target, ObjPath)
    if target.suffix in _IN_MEMORY and _MEMFD is not None:
        _put_from_memory(target, write, _MEMFD)
        return
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX) as folder:
        tmp = Path(folder) / target.name
        try:
            write(tmp)
            target.put_file(tmp)
        except OSError as exc:
            raise write_error(target, exc) from exc


# data files bound for an object store are made in memory (Linux): nothing lands on a worker's
# disk, not even when the worker is killed between writing and sending
_IN_MEMORY = (".parquet", ".arrow")
_MEMFD = getattr(os, "memfd_create", None) if os.path.isdir("/proc/self/fd") else None


def _put_from_memory(
    target: ObjPath, write: Callable[[Path], object], memfd: Callable[[str], int]
) -> None:
    fd = memfd(f"{TMP_PREFIX}{target.name}")
    try:
        tmp = Path(f"/proc/self/fd/{fd}")  # a path to the anonymous in-memory file
        write(tmp)
        target.put_file(tmp)
    except OSError as exc:
        raise write_error(target, exc) from exc
    finally:
        os.close(fd)


def atomic_write_bytes(target: OutPath, data: bytes) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(target: OutPath, text: str) -> None:
    atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; some file systems cannot fsync a folder (then it is skipped)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
