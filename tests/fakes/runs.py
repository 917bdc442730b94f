"""Running things in tests: the CLI in-process, and a fake server in its own process."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxprec.cli.main import main
from ctxprec.storage.core.seams import DEFAULT, Seams
from tests.fakes.inputs import REPO

__all__ = [
    "fake_request",
    "fake_stats",
    "high_water_kib",
    "judge_process",
    "score",
    "server_process",
]


def score(*args: object, seams: Seams = DEFAULT) -> int:
    """`ctxprec score ARGS --progress off`, in this process (its runs on `seams`); the exit code."""
    return main(["score", *map(str, args), "--progress", "off"], seams=seams)


@contextlib.contextmanager
def server_process(module: str, *flags: str) -> Iterator[str]:
    """`python -m MODULE --port 0 FLAGS` from the repository root: yields the URL it prints
    first (http://127.0.0.1:P/v1), and kills it on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.kill()
        proc.wait()


def judge_process(*flags: str) -> contextlib.AbstractContextManager[str]:
    """`tests.fakes.judge_server` in its own process (see `server_process`)."""
    return server_process("tests.fakes.judge_server", *flags)


def fake_request(url: str, path: str, method: str = "GET") -> dict[str, Any]:
    """A fake server's own endpoint (`/_fake/...`, beside its …/v1 URL): the JSON it answers."""
    root = url.rsplit("/v1", 1)[0]
    request = urllib.request.Request(f"{root}{path}", method=method)
    with urllib.request.urlopen(request, timeout=5) as reply:
        data: dict[str, Any] = json.loads(reply.read())
    return data


def fake_stats(url: str) -> dict[str, Any]:
    """A fake server's counters (GET /_fake/stats)."""
    return fake_request(url, "/_fake/stats")


def high_water_kib(child: subprocess.Popen[str]) -> int:
    """The peak resident memory of `child` (its VmHWM, which counts from its exec: ru_maxrss
    would count the pages it shared with this process before), read until it ends. It is a
    high-water mark, so a read after the peak sees it."""
    peak = 0
    while child.poll() is None:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{child.pid}/status").read_text()
            found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
            peak = max(peak, int(found.group(1))) if found else peak
        time.sleep(0.02)  # a poll interval, not a synchronisation: the mark only rises
    return peak
