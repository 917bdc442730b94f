"""Which files an INPUT names: a file, a folder (recursive), a glob or a Hive dataset, on local
disk or in an object store (`s3://`, `gs://`, `az://`, `file://`). Formats by extension:
Parquet, JSON Lines (`.jsonl`, `.ndjson`, `.json`) and CSV, the text formats also gzip- or
zstd-compressed (`.jsonl.gz`, `.csv.zst`, ...). Files in no known format are skipped, and said
so (`InputFiles.skipped`); names starting with `_` or `.` and ctxprec output folders are not
input. The one walk of a local input folder also records why each of its other files was not
read (`InputFiles.not_read`), for the run's notices.
"""

from __future__ import annotations

import fnmatch
import glob
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from ctxprec.storage.core.errors import InputError
from ctxprec.storage.core.settings import StorageSettings
from ctxprec.storage.files import fs, layout

__all__ = [
    "FORMATS",
    "InputFile",
    "InputFiles",
    "NotRead",
    "detect_format",
    "find_inputs",
    "input_root",
]

_GLOB_CHARS = frozenset("*?[")
FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".csv": "csv",
}
_CODECS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
KNOWN = "Parquet, JSON Lines (.jsonl/.ndjson/.json) or CSV, optionally .gz/.zst"


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: `path` is a local path (as found) or an object URI."""

    path: str
    format: str  # parquet | json | csv
    compression: str | None  # gzip | zstd | None
    size: int
    mtime_ns: int

    def __str__(self) -> str:
        return self.path

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def remote(self) -> bool:
        return fs.is_uri(self.path)

    def absolute(self) -> str:
        """The file's identity across machines and working directories."""
        return self.path if self.remote else str(Path(self.path).resolve())


@dataclass(frozen=True, slots=True)
class NotRead:
    """The files below a local input folder that were not read: how many for each reason (in the
    order first met, walking the folder in sorted order) and the first few, relative to it."""

    folder: str
    reasons: tuple[tuple[str, int], ...]
    examples: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.reasons)


@dataclass(frozen=True, slots=True)
class InputFiles:
    files: tuple[InputFile, ...]
    root: str  # where Hive partition folders start counting (see `input_root`)
    skipped: tuple[str, ...] = ()  # files with no known format, named
    not_read: NotRead | None = None  # a local folder's other files, with the reasons


def detect_format(name: str) -> tuple[str, str | None] | None:
    """(format, compression) from a file name, None when it is no input format."""
    lower = name.lower()
    compression = None
    for suffix, codec in _CODECS.items():
        if lower.endswith(suffix):
            compression, lower = codec, lower[: -len(suffix)]
            break
    for suffix, kind in FORMATS.items():
        if lower.endswith(suffix):
            if kind == "parquet" and compression:
                return None  # Parquet compresses inside the file
            return kind, compression
    return None


def _visible(rel: Sequence[str]) -> bool:
    return not any(part.startswith(("_", ".")) for part in rel)


def _normalize(spec: str | Path) -> str:
    """`file://` URIs become local paths; other URIs keep their form, without a trailing '/'."""
    text = str(spec)
    if fs.scheme_of(text) == "file":
        return unquote(urlsplit(text).path)
    if fs.is_uri(text):
        return text.rstrip("/") if not text.endswith("://") else text
    return text


def _rel_parts(path: str, root: str) -> tuple[str, ...]:
    if fs.is_uri(path):
        rest = path[len(root) :].strip("/")
        return tuple(rest.split("/")) if rest else ()
    return Path(path).relative_to(root).parts if root else Path(path).parts


class _Lister:
    """Finds input files below one root, local or remote, with the same rules."""

    def __init__(self, options: StorageSettings | None) -> None:
        self.options = options
        self.skipped: list[str] = []
        self._outputs: dict[str, bool] = {}
        self._listed: set[str] = set()  # every object below a listed prefix (no HEAD per folder)
        self._prefixes: list[str] = []
        self.walked: list[Path] = []  # every file below the last local folder listed

    def _is_output(self, folder: str) -> bool:
        if folder not in self._outputs:
            marker = fs.join(folder, layout.MANIFEST_KEY)
            if marker in self._listed:
                found = True
            elif fs.is_uri(marker) and any(folder.startswith(p) for p in self._prefixes):
                found = False  # below a listed prefix: the listing is complete
            elif fs.is_uri(marker):
                found = fs.file_info(marker, self.options).type == pafs.FileType.File
            else:
                found = Path(marker).is_file()
            self._outputs[folder] = found
        return self._outputs[folder]

    def _outside_outputs(self, paths: Sequence[str], root: str) -> list[str]:
        """Leave out the part files of ctxprec output folders below `root`: an output folder put
        inside the input folder must not be read as input by the next run."""
        kept = []
        for path in paths:
            parts = _rel_parts(path, root)
            remote = fs.is_uri(root)
            prefixes = (
                fs.join(root, "/".join(parts[:i])) if remote else str(Path(root, *parts[:i]))
                for i in range(1, len(parts))
            )
            if not any(self._is_output(p) for p in prefixes):
                kept.append(path)
        return kept

    def file(self, path: str, info: pafs.FileInfo | None = None) -> InputFile | None:
        found = detect_format(PurePosixPath(path).name)
        if found is None:
            self.skipped.append(path)
            return None
        if info is None:
            info = fs.file_info(path, self.options)
        mtime = info.mtime_ns if info.mtime_ns is not None else 0
        return InputFile(path, found[0], found[1], int(info.size or 0), int(mtime))

    def folder(self, root: str) -> list[InputFile]:
        if fs.is_uri(root):
            listed = fs.entries(root, self.options)
            prefix = fs.resolve(root, self.options)[1]
            # the filesystem's paths are BUCKET/KEY: back to the URI the user gave
            paths: dict[str, pafs.FileInfo | None] = {
                f"{root}{e.path[len(prefix) :]}": e for e in listed
            }
            self._listed.update(paths)
            self._prefixes.append(root + "/")
        else:
            local = [p for p in Path(root).rglob("*") if p.is_file()]
            self.walked = local
            paths = dict.fromkeys(map(str, local))
        visible = [p for p in paths if _visible(_rel_parts(p, root))]
        files = []
        for path in sorted(self._outside_outputs(visible, root)):
            f = self.file(path, paths[path])
            if f is not None:
                files.append(f)
        return files

    def pattern(self, pattern: str) -> list[InputFile]:
        root = _glob_root(pattern)
        if fs.is_uri(pattern):
            entries = self.folder(root)
            # `**/` also matches no folder at all, as in a local glob
            flat = pattern.replace("**/", "")
            return [
                f
                for f in entries
                if fnmatch.fnmatchcase(f.path, pattern) or fnmatch.fnmatchcase(f.path, flat)
            ]
        found: list[InputFile] = []
        for match in sorted(glob.glob(pattern, recursive=True)):
            path = Path(match)
            if not _visible(path.relative_to(root).parts if root else path.parts):
                continue
            if path.is_dir():
                found += self.folder(str(path))
            elif path.is_file() and not self._outside_outputs([str(path)], root):
                continue
            elif path.is_file():
                f = self.file(str(path), fs.file_info(str(path)))
                found += [f] if f is not None else []
        return found


def _glob_root(pattern: str) -> str:
    if fs.is_uri(pattern):
        scheme, _, rest = pattern.partition("://")
        kept: list[str] = []
        for part in rest.split("/"):
            if _GLOB_CHARS & set(part):
                break
            kept.append(part)
        return f"{scheme}://{'/'.join(kept)}"
    prefix: list[str] = []
    for part in Path(pattern).parts:
        if _GLOB_CHARS & set(part):
            break
        prefix.append(part)
    return str(Path(*prefix)) if prefix else ""


def _unique(files: Collection[InputFile]) -> tuple[InputFile, ...]:
    return tuple(sorted({f.path: f for f in files}.values(), key=lambda f: f.path))


def _skipped(lister: _Lister) -> tuple[str, ...]:
    return tuple(sorted(set(lister.skipped)))


def find_inputs(spec: str | Path, options: StorageSettings | None = None) -> InputFiles:
    """A file, a folder or prefix (recursive, skipping `_*` and `.*`), a glob, or a Hive
    dataset; an InputError that says what to do when it names no input file."""
    text = _normalize(spec)
    lister = _Lister(options)
    info = fs.file_info(text, options)
    if info.type == pafs.FileType.Directory or (
        fs.is_uri(text) and info.type == pafs.FileType.NotFound and not _GLOB_CHARS & set(text)
    ):
        files = lister.folder(text)
        if not files:
            if info.type == pafs.FileType.NotFound:
                raise InputError(
                    f"input {text} does not exist (no object under that prefix); check the "
                    "bucket and path, and the credentials and endpoint in the environment"
                )
            raise InputError(
                f"folder {text} holds no input files ({KNOWN}; names starting with '_' or '.' "
                f"and ctxprec output folders are skipped){_skip_note(lister)}; point at the "
                "folder with the data or use a glob"
            )
        not_read = None if fs.is_uri(text) else _not_read(text, lister.walked, files)
        return InputFiles(_unique(files), text, _skipped(lister), not_read)
    if info.type == pafs.FileType.File:
        f = lister.file(text, info)
        if f is None:
            raise InputError(
                f"{text} is in no input format ({KNOWN}); convert it, or rename it if the "
                "extension is wrong"
            )
        return InputFiles((f,), _parent(text), ())
    if _GLOB_CHARS & set(text):
        files = lister.pattern(text)
        if not files:
            raise InputError(
                f"glob `{text}` matched no input files ({KNOWN}){_skip_note(lister)}; check the "
                "pattern (and quote it so the shell does not expand it)"
            )
        return InputFiles(_unique(files), _glob_root(text), _skipped(lister))
    raise InputError(
        f"input {text} does not exist; give a Parquet, JSON Lines or CSV file, a folder of "
        "them, a glob such as 'data/**/*.parquet', or an object-store URI (s3://BUCKET/PATH)"
    )


NOT_READ_HIDDEN = "hidden or starting with '_'"
NOT_READ_FORMAT = "in no input format (Parquet, JSON Lines, CSV)"
NOT_READ_OUTPUT = "inside a ctxprec output folder"


def _not_read(root: str, walked: Sequence[Path], read: Sequence[InputFile]) -> NotRead | None:
    """Why each file of the folder's walk that is not input was left out."""
    base = Path(root)
    names = {f.path for f in read}
    taken = {Path(f.path).resolve() for f in read}
    reasons: dict[str, int] = {}
    examples: list[str] = []
    for path in sorted(walked):
        if str(path) in names or path.resolve() in taken:
            continue
        rel = path.relative_to(base)
        if not _visible(rel.parts):
            why = NOT_READ_HIDDEN
        elif detect_format(path.name) is None:
            why = NOT_READ_FORMAT
        else:
            why = NOT_READ_OUTPUT
        reasons[why] = reasons.get(why, 0) + 1
        if len(examples) < 3:
            examples.append(str(rel))
    if not reasons:
        return None
    return NotRead(str(base), tuple(reasons.items()), tuple(examples))


def _skip_note(lister: _Lister) -> str:
    skipped = _skipped(lister)
    if not skipped:
        return ""
    return f" (skipped, in no input format: {', '.join(skipped[:5])})"


def _parent(path: str) -> str:
    if fs.is_uri(path):
        return path.rsplit("/", 1)[0]
    return str(Path(path).parent)


def input_root(found: InputFiles) -> str:
    return found.root
