"""An output folder in an object store, spelled like a `pathlib.Path`: `ObjPath` is a key prefix
in a pyarrow filesystem (`ctxprec.storage.files.fs`) with the few path operations ctxprec's storage
code uses. `OutPath` (a local `Path` or an `ObjPath`) is what every OUTDIR function takes, so one
code path serves both; mypy checks that nothing calls a local-only method on an object-store path.

Object stores have no folders, no rename and no O_EXCL: `mkdir` does nothing, a write is one PUT
under the final name (visible whole or not at all), and a "folder" exists while a key lies below
it. Strong read-after-write consistency (S3 since 2020, GCS, Azure) is assumed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.settings import StorageSettings
from ctxprec.storage.files import fs as storage_fs

__all__ = [
    "ObjPath",
    "ObjStat",
    "OutPath",
    "local_copies",
    "out_path",
    "readable",
    "with_options",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


@dataclass(frozen=True)
class ObjStat:
    st_mtime: float
    st_size: int


class ObjPath:
    """`fs` + `path` (bucket/key, no leading or trailing slash); `root_uri` names `root` for
    messages (`s3://bucket/scores`), so a path prints as the URI the user typed."""

    __slots__ = ("fs", "path", "root", "root_uri")

    def __init__(self, fs: pafs.FileSystem, path: str, root: str, root_uri: str) -> None:
        self.fs = fs
        self.path = path.strip("/")
        self.root = root.strip("/")
        self.root_uri = root_uri.rstrip("/")

    @classmethod
    def from_uri(cls, uri: str, options: StorageSettings | None = None) -> ObjPath:
        fs, path = storage_fs.resolve(uri, options)
        return cls(fs, path, path, uri)

    # -- pure path operations ----------------------------------------------------------------
    def _with(self, path: str) -> ObjPath:
        return ObjPath(self.fs, path, self.root, self.root_uri)

    def __truediv__(self, name: str | PurePosixPath) -> ObjPath:
        rel = str(name).strip("/")
        return self._with(f"{self.path}/{rel}" if rel else self.path)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> ObjPath:
        return self._with(self.path.rsplit("/", 1)[0]) if "/" in self.path else self

    @property
    def parents(self) -> list[ObjPath]:
        found, here = [], self
        while "/" in here.path:
            here = here.parent
            found.append(here)
        return found

    def with_name(self, name: str) -> ObjPath:
        return self.parent / name

    def relative_to(self, other: ObjPath) -> PurePosixPath:
        if self.path == other.path:
            return PurePosixPath(".")
        if not self.path.startswith(other.path + "/"):
            raise ValueError(f"{self} is not below {other}")
        return PurePosixPath(self.path[len(other.path) + 1 :])

    def relative_to_root(self) -> str:
        return self.path[len(self.root) :].strip("/")

    def resolve(self) -> ObjPath:
        return self

    def absolute(self) -> ObjPath:
        return self

    def __str__(self) -> str:
        if self.path == self.root:
            return self.root_uri
        if self.path.startswith(self.root + "/"):
            return f"{self.root_uri}/{self.path[len(self.root) + 1 :]}"
        return self.path

    def __repr__(self) -> str:
        return f"ObjPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjPath) and (self.fs, self.path) == (other.fs, other.path)

    def __hash__(self) -> int:
        return hash(self.path)

    def __lt__(self, other: ObjPath) -> bool:
        return self.path < other.path

    # -- reading -------------------------------------------------------------------------------
    def _info(self) -> pafs.FileInfo:
        try:
            info = self.fs.get_file_info(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(_access_error(self, exc)) from exc
        assert isinstance(info, pafs.FileInfo)
        return info

    def exists(self) -> bool:
        return bool(self._info().type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        return bool(self._info().type == pafs.FileType.File)

    def is_dir(self) -> bool:
        return bool(self._info().type == pafs.FileType.Directory)

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> ObjStat:
        info = self._info()
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(str(self))
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        return ObjStat(mtime, int(info.size or 0))

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path, compression=None) as stream:
                data: bytes = stream.read()
                return data
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            if not self.is_file():
                raise FileNotFoundError(str(self)) from exc
            raise OSError(_access_error(self, exc)) from exc

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def _children(self, recursive: bool) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path, recursive=recursive, allow_not_found=True)
        try:
            found = self.fs.get_file_info(selector)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(_access_error(self, exc)) from exc
        return list(found)

    def iterdir(self) -> Iterator[ObjPath]:
        for info in self._children(recursive=False):
            yield self._with(info.path)

    def glob(self, pattern: str) -> Iterator[ObjPath]:
        """Files and "folders" directly below whose name matches `pattern`."""
        for info in self._children(recursive=False):
            if fnmatch.fnmatchcase(info.base_name, pattern):
                yield self._with(info.path)

    def rglob(self, pattern: str) -> Iterator[ObjPath]:
        """Every file below (any depth) whose name matches `pattern`."""
        for info in self._children(recursive=True):
            if info.type == pafs.FileType.File and fnmatch.fnmatchcase(info.base_name, pattern):
                yield self._with(info.path)

    # -- writing -------------------------------------------------------------------------------
    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no folders: nothing to create."""

    def rmdir(self) -> None:
        """Nothing to remove: a prefix without keys does not exist."""

    def write_bytes(self, data: bytes) -> int:
        """One PUT under the final name: readers see the old object or the new one, whole."""
        with self.fs.open_output_stream(self.path, compression=None) as out:
            out.write(data)
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def put_file(self, local: Path) -> None:
        """Upload a local file as this object (one PUT; multipart for large files, which
        becomes visible only once complete)."""
        with (
            open(local, "rb") as src,
            self.fs.open_output_stream(self.path, compression=None) as out,
        ):
            shutil.copyfileobj(src, out, 8 << 20)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        except (OSError, pa.ArrowException) as exc:
            if self.exists():
                raise OSError(_access_error(self, exc)) from exc
            if not missing_ok:
                raise FileNotFoundError(str(self)) from exc


OutPath = Path | ObjPath


def out_path(spec: str | OutPath, options: StorageSettings | None = None) -> OutPath:
    """The output folder named on the command line: an `ObjPath` for s3://, gs://, az://,
    abfs[s]:// URIs, a local `Path` for a path or a file:// URI; any other URL is refused before
    anything is created (`Path` folds `s3://b` to `s3:/b`: both spellings are read)."""
    if isinstance(spec, ObjPath):
        return spec
    text = str(spec)
    if text.startswith("file:/"):
        return Path("/" + text.removeprefix("file:").lstrip("/"))
    match = _SCHEME.match(text)
    if match is None:
        return Path(spec)
    text = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)", r"\1://", text)
    if storage_fs.is_uri(text):
        try:
            return ObjPath.from_uri(text, options)
        except Exception as exc:  # the filesystem's own message, never a credential
            if isinstance(exc, OutputError):
                raise
            raise OutputError(f"output {text}: {exc}") from exc
    known = "s3://, gs://, az://, abfs[s]:// or file://"
    raise OutputError(
        f"output {text}: {match.group(1)}:// is not a storage ctxprec writes to; "
        f"use a local folder or a {known} URI"
    )


def with_options(path: OutPath, options: StorageSettings) -> OutPath:
    """`path` resolved again with the `[storage]` options of the configuration."""
    if isinstance(path, ObjPath) and options != StorageSettings():
        return ObjPath.from_uri(path.root_uri, options) / str(path.relative_to_root())
    return path


def readable(path: OutPath) -> Any:
    """What pyarrow readers take: the local path, or an open input file in the object store."""
    if isinstance(path, ObjPath):
        return path.fs.open_input_file(path.path)
    return path


@contextlib.contextmanager
def local_copies(paths: Sequence[OutPath], root: OutPath) -> Iterator[list[Path]]:
    """Local paths of `paths` (below `root`) for readers that need files on disk (Polars scans
    with Hive folders): local ones as they are, object-store ones copied into a temp folder
    under the same relative paths (removed afterwards)."""
    if not isinstance(root, ObjPath):
        yield [p for p in paths if isinstance(p, Path)]
        return
    with tempfile.TemporaryDirectory(prefix="ctxprec-read-") as tmp:
        local = []
        for path in paths:
            assert isinstance(path, ObjPath)
            target = Path(tmp) / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            with (
                path.fs.open_input_stream(path.path, compression=None) as src,
                open(target, "wb") as out,
            ):
                shutil.copyfileobj(src, out, 8 << 20)
            local.append(target)
        yield local


def _access_error(path: ObjPath, exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return (
        f"cannot access {path} ({text}); check the URI, the credentials in the environment "
        "(AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*) and [storage] endpoint_url"
    )
