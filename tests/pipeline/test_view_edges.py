"""`ctxprec view` at its edges: it serves only regular files inside the output (a summary.html
that is a link, a FIFO or a link to /dev/zero is refused at start-up, and one swapped in later
is a 404 that ties up nothing, so SIGINT and SIGTERM still stop the server); aiohttp's own error
replies carry the same security headers as every other reply and echo nothing; a connection
that does not send its request's head in time is closed, and connections past the cap get a
503. Raw sockets on loopback."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import anyio.from_thread
import pytest

from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.report.table import RowTable
from ctxprec.view import serve
from tests.fakes.inputs import write_input
from tests.fakes.runs import score
from tests.fakes.viewer import Started, get

SECRET = "not for the network\n"


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("view-edges")
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXPREC_CACHE_DIR", str(root / "memo"))
        assert score(write_input(root / "in.parquet", range(6)), "-o", out) == 0
    assert (out / "summary.html").is_file()
    return out


def _copy(output: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(output, out)
    return out


# -- the real command: what it serves ----------------------------------------------------------
def _link_out(path: Path) -> None:
    path.symlink_to(path.parent.parent / "secret.txt")


def _past_the_cap(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(65 << 20)  # sparse: no disk is used


NOT_SERVED: dict[str, Callable[[Path], None]] = {
    "a link out of the output": _link_out,
    "a FIFO": lambda path: os.mkfifo(path),
    "a link to /dev/zero": lambda path: path.symlink_to("/dev/zero"),
    "a folder": lambda path: path.mkdir(),
    "past the size cap": _past_the_cap,
}


@pytest.mark.parametrize("name", ["summary.html", "summary.json"])
@pytest.mark.parametrize("kind", list(NOT_SERVED))
def test_a_report_that_is_not_a_regular_file_is_refused_at_start(
    kind: str, name: str, output: Path, tmp_path: Path
) -> None:
    out = _copy(output, tmp_path)
    (tmp_path / "secret.txt").write_text(SECRET)
    (out / name).unlink()
    NOT_SERVED[kind](out / name)
    started = Started(out)
    code, err = started.stop()
    assert started.url is None, f"served {kind} as {name}"
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("ctxprec")]
    assert len(lines) == 1, err
    assert f"{out / name} is " in lines[0]
    assert "serves only regular files inside the output" in lines[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("kind", ["a link out of the output", "a FIFO", "a link to /dev/zero"])
def test_a_report_swapped_after_start_is_not_served_and_the_server_still_stops(
    kind: str, sig: int, output: Path, tmp_path: Path
) -> None:
    out = _copy(output, tmp_path)
    (tmp_path / "secret.txt").write_text(SECRET)
    started = Started(out)
    assert started.url is not None
    assert get(started.url + "summary.html")[0] == 200
    page = out / "summary.html"
    page.unlink()
    NOT_SERVED[kind](page)
    for _ in range(4):  # more than the query threads: none of them is left blocked
        status, headers, body = get(started.url + "summary.html")
        assert status == 404, body
        assert SECRET.strip() not in json.dumps(body)
        assert headers["X-Content-Type-Options"] == "nosniff"
    assert get(started.url + "api/info")[0] == 200
    code, err = started.stop(sig)
    assert code == (130 if sig == signal.SIGINT else 143), err
    assert "Traceback" not in err


def _rewritten(path: Path) -> None:
    import polars as pl

    pl.read_parquet(path).head(1).write_parquet(path)


PART_SWAPS: dict[str, Callable[[Path], None]] = {
    "a FIFO": lambda path: (path.unlink(), os.mkfifo(path)),
    "a link out of the output": lambda path: (path.unlink(), _link_out(path)),
    "rewritten": _rewritten,
}


@pytest.mark.parametrize("kind", list(PART_SWAPS))
def test_a_part_swapped_after_start_is_not_read_and_the_server_still_stops(
    kind: str, output: Path, tmp_path: Path
) -> None:
    out = _copy(output, tmp_path)
    (tmp_path / "secret.txt").write_text(SECRET)
    started = Started(out)
    assert started.url is not None
    assert get(started.url + "api/rows?size=5")[0] == 200
    PART_SWAPS[kind](sorted(out.glob("part-*.parquet"))[0])
    for path in ("api/rows?size=5", "api/rows?sort=score", "api/row/r1", "api/rows?q=r"):
        status, headers, body = get(started.url + path)
        assert status == 500, body
        assert "changed since they were checked" in body["error"]
        assert headers["X-Content-Type-Options"] == "nosniff"
    code, err = started.stop(signal.SIGTERM)
    assert code == 143, err


# -- the server in this process, on seams a test can time -----------------------------------
@contextmanager
def _serving(output: Path, seams: Seams) -> Iterator[tuple[str, int]]:
    """`serve` over `output` on a free loopback port in a thread: (host, port)."""
    bound: queue.Queue[str] = queue.Queue()
    with anyio.from_thread.start_blocking_portal() as portal:
        running = portal.start_task_soon(
            lambda: serve(
                [RowTable(output)], "127.0.0.1", 0, loopback_only=True,
                started=bound.put, seams=seams,
            )
        )  # fmt: skip
        url = bound.get(timeout=60)
        try:
            host, port = url.removeprefix("http://").rstrip("/").split(":")
            yield host, int(port)
        finally:
            running.cancel()


def _exchange(address: tuple[str, int], data: bytes, timeout: float = 30.0) -> bytes:
    """Send `data` on a new connection, then read until the server closes it."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _reply(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _secured(headers: dict[str, str]) -> None:
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert "default-src 'none'" in headers.get("content-security-policy", ""), headers
    assert headers.get("x-frame-options") == "DENY", headers


MARK = "echo-me-not"
BAD_REQUESTS = {
    "request line over 8,190 bytes": f"GET /{MARK}{'A' * 9000} HTTP/1.1\r\nHost: {{host}}\r\n\r\n",
    "duplicate Host": f"GET /{MARK} HTTP/1.1\r\nHost: {{host}}\r\nHost: {MARK}.example\r\n\r\n",
    "not HTTP": f"\x16\x03\x01{MARK} \x00\x01\r\n\r\n",
    "header over 8,190 bytes": (
        f"GET / HTTP/1.1\r\nHost: {{host}}\r\nX-{MARK}: {'B' * 9000}\r\n\r\n"
    ),
}


@pytest.mark.parametrize("bad", list(BAD_REQUESTS))
def test_aiohttps_own_error_replies_carry_the_headers_and_echo_nothing(
    bad: str, output: Path
) -> None:
    with _serving(output, DEFAULT) as (host, port):
        raw = BAD_REQUESTS[bad].replace("{host}", f"{host}:{port}").encode("latin-1")
        status, headers, body = _reply(_exchange((host, port), raw))
        assert status == 400, body
        _secured(headers)
        assert MARK.encode() not in body
        assert json.loads(body)["status"] == 400


def test_a_connection_that_does_not_send_its_head_in_time_is_closed(output: Path) -> None:
    seams = replace(DEFAULT, view_header_s=0.5)
    with _serving(output, seams) as (host, port):
        # the head's first line, then nothing: closed by the server (recv sees the end)
        assert _exchange((host, port), b"GET / HTTP/1.1\r\n", timeout=30) == b""
        # one byte at a time does not keep it open either
        with socket.create_connection((host, port), timeout=30) as sock:
            closed = False
            for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 1000:
                try:
                    sock.sendall(bytes([byte]))
                    sock.settimeout(0.1)
                    closed = sock.recv(1) == b""
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                if closed:
                    break
            assert closed, "a connection trickling its head stayed open for 100 s"
        # a request sent in time is answered
        status, headers, _ = _reply(
            _exchange((host, port), f"GET /api/info HTTP/1.1\r\nHost: {host}:{port}\r\n"
                      "Connection: close\r\n\r\n".encode())
        )  # fmt: skip
        assert status == 200
        _secured(headers)


def test_connections_past_the_cap_get_a_503_and_are_closed(output: Path) -> None:
    seams = replace(DEFAULT, view_header_s=60.0, view_connections=4)
    with _serving(output, seams) as (host, port):
        held = []
        try:
            for _ in range(4):  # each answered once, then kept open (keep-alive)
                sock = socket.create_connection((host, port), timeout=30)
                held.append(sock)
                sock.sendall(f"GET /view.css HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            status, headers, body = _reply(_exchange((host, port), b"GET / HTTP/1.1\r\n\r\n"))
            assert status == 503
            _secured(headers)
            assert json.loads(body)["status"] == 503
        finally:
            for sock in held:
                sock.close()
