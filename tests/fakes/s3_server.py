"""A real S3 protocol server on loopback for tests: moto's server mode in a subprocess on a free
port (`moto_server -H 127.0.0.1 -p PORT`), waited for, killed at the end; plus the environment
a client needs to reach it (`AWS_ENDPOINT_URL`, dummy credentials) and small upload helpers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

__all__ = ["ACCESS_KEY", "SECRET_KEY", "S3Server", "running_s3_server"]

ACCESS_KEY = "AKIACTXPRECTESTKEY01"
SECRET_KEY = "ctxprec-test-secret-8f3e1c9b5a7d42e6"  # tests grep every output for it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class S3Server:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self) -> pafs.S3FileSystem:
        host = self.endpoint.split("://", 1)[1]
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=host,
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def upload(self, local: Path, key: str) -> None:
        """Copy a local file to BUCKET/KEY."""
        with self.filesystem().open_output_stream(key, compression=None) as out:
            out.write(local.read_bytes())

    def put(self, key: str, data: bytes) -> None:
        with self.filesystem().open_output_stream(key, compression=None) as out:
            out.write(data)


@contextlib.contextmanager
def running_s3_server(timeout_s: float = 30.0) -> Iterator[S3Server]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/", timeout=1):
                    break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield S3Server(endpoint)
    finally:
        proc.kill()
        proc.wait()
