"""`ctxprec view` as its tests run it: two outputs of the offline judge over the sample plus
hostile rows (markup in ids, queries and items), and the real command started as a subprocess
on a free loopback port, its URL read from its first line, stopped with SIGINT."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tests.fakes.inputs import REPO, SAMPLE

__all__ = [
    "HOSTILE",
    "Started",
    "Viewer",
    "get",
    "make_outputs",
    "tree_digest",
    "viewer",
]

# what a page must show as text and never run: each sets window.__pwned if it ran
HOSTILE = [
    "<script>window.__pwned = 1</script>",
    '" onload="window.__pwned = 1" x="',
    '<img src=x onerror="window.__pwned = 1">',
    "</td></tr><svg onload=window.__pwned=1>",
]


def _hostile_rows() -> pl.DataFrame:
    n = len(HOSTILE)
    return pl.DataFrame(
        {
            "id": [f"h{i}{text[:12]}" for i, text in enumerate(HOSTILE)],
            "retriever": ['<b onmouseover="window.__pwned=1">x</b>'] * n,
            "query": [f"Hostile {i}: {text}" for i, text in enumerate(HOSTILE)],
            "expected_output": [f"Answer {text}" for text in HOSTILE],
            "contexts": [[f"Answer {text}", text, "plain text"] for text in HOSTILE],
            "labels": [[True, False, False]] * n,
        }
    )


def make_outputs(root: Path) -> tuple[Path, Path]:
    """A: the sample and the hostile rows; B: the same with every context list reversed (so
    scores move). Both keep the query and the items (--passthrough) and group by retriever."""
    base = pl.concat([pl.read_parquet(SAMPLE), _hostile_rows()], how="vertical_relaxed")
    sides = {"a": base, "b": base.with_columns(pl.col("contexts").list.reverse())}
    outs = []
    for name, frame in sides.items():
        src = root / f"{name}.parquet"
        frame.write_parquet(src)
        out = root / f"out-{name}"
        flags = ["--passthrough", "retriever,query,contexts", "--group-by", "retriever"]
        args = ["score", str(src), "-o", str(out), "--progress", "off", *flags]
        # a process of its own: a test may hold a running event loop (Playwright's) here
        done = subprocess.run(
            [sys.executable, "-m", "ctxprec.cli.main", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outs.append(out)
    return outs[0], outs[1]


def tree_digest(folder: Path) -> str:
    """Every file below `folder` (names, sizes, bytes) as one hash."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class Viewer:
    url: str
    process: subprocess.Popen[str]

    def stop(self) -> tuple[int, str]:
        """SIGINT (Ctrl-C), then the exit code and what it said on stderr."""
        self.process.send_signal(signal.SIGINT)
        _, err = self.process.communicate(timeout=60)
        return self.process.returncode, err


def _command() -> list[str]:
    script = Path(sys.executable).parent / "ctxprec"  # the console script users run
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "ctxprec.cli.main"]


@contextmanager
def viewer(*args: str | Path) -> Iterator[Viewer]:
    """`ctxprec view ARGS --port 0` running; its URL from the line it prints."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [*_command(), "view", *map(str, args), "--port", "0"]
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if found is None:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"ctxprec view printed {line!r}; stderr: {err}")
    running = Viewer(found.group(0), process)
    try:
        yield running
    finally:
        if process.poll() is None:
            running.stop()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body or text) of one GET."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, head, body = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, head, body = exc.code, dict(exc.headers), exc.read()
    text = body.decode("utf-8", "replace")
    if head.get("Content-Type", "").startswith("application/json"):
        return status, head, json.loads(text)
    return status, head, text


class Started:
    """`ctxprec view OUT --port 0` as a process: its URL, or its exit code and stderr when it
    refused to start."""

    def __init__(self, out: Path) -> None:
        script = Path(sys.executable).parent / "ctxprec"
        cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "ctxprec"]
        self.process = subprocess.Popen(
            [*cmd, "view", str(out), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            self.process.kill()
            raise AssertionError("ctxprec view printed nothing in 60 s (blocked)") from None
        self.url = line.split(" at ", 1)[1].split()[0] if " at http" in line else None

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise AssertionError(f"ctxprec view did not stop on signal {sig}") from None
        return self.process.returncode, err
