"""One filesystem layer for local paths and object stores (pyarrow.fs): `s3://`, `gs://`,
`az://` / `abfs[s]://` and `file://` URIs resolve to a pyarrow filesystem and a path in it.

Credentials come from each cloud's standard environment and config files (the AWS SDK's chain:
`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `~/.aws/...`; `GOOGLE_APPLICATION_CREDENTIALS`; Azure's
`AZURE_STORAGE_ACCOUNT_NAME` / `AZURE_STORAGE_ACCOUNT_KEY` or its default credential chain).
`StorageSettings` (the `[storage]` TOML section, storage/core/settings.py) holds only non-secret
settings: endpoint, region, anonymous access. Nothing here ever puts a credential into a
message, a repr or a file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ctxprec.storage.core.errors import InputError
from ctxprec.storage.core.settings import StorageSettings  # the [storage] section

__all__ = [
    "SCHEMES",
    "entries",
    "file_info",
    "is_uri",
    "join",
    "resolve",
]

SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "file"})
_S3 = frozenset({"s3", "s3a"})
_GCS = frozenset({"gs", "gcs"})
_AZURE = frozenset({"az", "abfs", "abfss"})


def is_uri(spec: str | Path) -> bool:
    """True for `scheme://...` with a scheme this layer knows (`file://` included)."""
    if isinstance(spec, Path):
        return False
    scheme, sep, _ = spec.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def scheme_of(spec: str) -> str:
    return spec.partition("://")[0].lower() if "://" in spec else ""


def join(base: str, name: str) -> str:
    """`base` / `name` for local paths and URIs alike."""
    return f"{base.rstrip('/')}/{name}" if is_uri(base) else str(Path(base) / name)


def _endpoint(options: StorageSettings, env: Mapping[str, str], *names: str) -> str | None:
    if options.endpoint_url:
        return options.endpoint_url
    for name in names:
        if env.get(name):
            return env[name]
    return None


def _split_endpoint(url: str) -> tuple[str, str]:
    """`http://127.0.0.1:9000` -> ("http", "127.0.0.1:9000"); a bare host means https."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    return parts.scheme or "https", parts.netloc


_FILESYSTEMS: dict[tuple[object, ...], pafs.FileSystem] = {}
_LOCK = threading.Lock()


def _s3(bucket: str, options: StorageSettings, env: Mapping[str, str]) -> pafs.FileSystem:
    endpoint = _endpoint(options, env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    region = options.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    kwargs: dict[str, object] = {"anonymous": options.anonymous}
    if endpoint:
        scheme, host = _split_endpoint(endpoint)
        kwargs.update(endpoint_override=host, scheme=scheme, region=region or "us-east-1")
    else:
        if not region:
            try:
                region = pafs.resolve_s3_region(bucket)
            except (OSError, pa.ArrowException):
                region = "us-east-1"
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]


def _gcs(options: StorageSettings, env: Mapping[str, str]) -> pafs.FileSystem:
    endpoint = _endpoint(options, env, "STORAGE_EMULATOR_HOST")
    kwargs: dict[str, object] = {"anonymous": options.anonymous}
    if endpoint:
        scheme, host = _split_endpoint(endpoint)
        kwargs.update(endpoint_override=host, scheme=scheme)
    return pafs.GcsFileSystem(**kwargs)  # type: ignore[arg-type]


def _azure(account: str, options: StorageSettings, env: Mapping[str, str]) -> pafs.FileSystem:
    if not account:
        raise InputError(
            "an az:// URI needs the storage account: set AZURE_STORAGE_ACCOUNT_NAME, or write "
            "abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
        )
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_KEY") or None
    kwargs: dict[str, object] = {"account_name": account, "account_key": key}
    endpoint = _endpoint(options, env, "AZURE_STORAGE_ENDPOINT")
    if endpoint:
        scheme, host = _split_endpoint(endpoint)
        kwargs.update(
            blob_storage_authority=host,
            dfs_storage_authority=host,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    return pafs.AzureFileSystem(**kwargs)  # type: ignore[arg-type]


def _cached(key: tuple[object, ...], make: object) -> pafs.FileSystem:
    with _LOCK:
        found = _FILESYSTEMS.get(key)
        if found is None:
            found = make()  # type: ignore[operator]
            _FILESYSTEMS[key] = found
        assert isinstance(found, pafs.FileSystem)
        return found


def resolve(
    spec: str | Path,
    options: StorageSettings | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it for a local path or a URI. Filesystems are cached
    per scheme, bucket/account and options (credentials are read by the clouds' SDKs)."""
    options = options or StorageSettings()
    env = os.environ if env is None else env
    text = str(spec)
    if not is_uri(spec):
        return pafs.LocalFileSystem(), os.path.abspath(text)
    scheme = scheme_of(text)
    parts = urlsplit(text)
    if scheme == "file":
        return pafs.LocalFileSystem(), unquote(parts.path)
    bucket = parts.netloc
    if not bucket:
        raise InputError(f"{text} names no bucket; write {scheme}://BUCKET/PATH")
    key = parts.path.lstrip("/")
    path = f"{bucket}/{key}".rstrip("/") if key else bucket
    envkey = tuple(sorted((k, v) for k, v in env.items() if k.startswith(("AWS_", "AZURE_"))))
    if scheme in _S3:
        fs = _cached(("s3", bucket, options, hash(envkey)), lambda: _s3(bucket, options, env))
        return fs, path
    if scheme in _GCS:
        return _cached(("gs", options, hash(envkey)), lambda: _gcs(options, env)), path
    # az://container/path (account from the environment) or abfs://container@account.dfs...
    container, _, host = bucket.partition("@")
    account = host.split(".", 1)[0] if host else env.get("AZURE_STORAGE_ACCOUNT_NAME", "")
    fs = _cached(("az", account, options, hash(envkey)), lambda: _azure(account, options, env))
    return fs, f"{container}/{key}".rstrip("/") if key else container


def file_info(spec: str | Path, options: StorageSettings | None = None) -> pafs.FileInfo:
    """What is at `spec` (type NotFound when nothing); errors name the URI, never a key."""
    fs, path = resolve(spec, options)
    try:
        info = fs.get_file_info(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(_access_error(str(spec), exc)) from exc
    assert isinstance(info, pafs.FileInfo)
    return info


def entries(spec: str | Path, options: StorageSettings | None = None) -> list[pafs.FileInfo]:
    """Every file below the folder or prefix `spec`, recursively (paths inside its filesystem)."""
    fs, path = resolve(spec, options)
    try:
        found = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        raise InputError(_access_error(str(spec), exc)) from exc
    return [f for f in found if f.type == pafs.FileType.File]


def _access_error(spec: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return (
        f"cannot access {spec} ({text}); check the URI, the credentials in the environment "
        "(AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*) and [storage] endpoint_url"
    )
