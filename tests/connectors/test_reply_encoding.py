"""The reply cap holds after decompression: a gzip-encoded 10 MB reply was accepted where the
same reply uncompressed failed `reply_too_large`, and a 408 KB gzip body that expands to 400 MB
took 2.6 GB of memory (and went back to the judge in the re-ask). The decoded bytes are capped,
whatever the Content-Encoding, before they are held; a too-large reply is a failed call, never
shown to the judge again. Every server here is a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from aiohttp import web

from ctxprec.connectors.judges.transport import AiohttpTransport, HttpRequest
from tests.fakes.hostile_judge import HostileJudge, chat_completion
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import start_loopback
from tests.fakes.runs import high_water_kib, score

KEY = "sk-test-encoding-0123456789"
VERDICT = json.dumps({"relevant": True, "reason": "It gives the figure."})


def gzip_bytes(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


def deflate_bytes(data: bytes) -> bytes:  # RFC 9110's deflate: a zlib stream
    return zlib.compress(data, 9)


def raw_deflate_bytes(data: bytes) -> bytes:  # what some servers send as "deflate"
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


ENCODERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip_bytes),
    "deflate": ("deflate", deflate_bytes),
    "raw-deflate": ("deflate", raw_deflate_bytes),
}


def encoded(kind: str, body: bytes) -> web.Response:
    name, encode = ENCODERS[kind]
    headers = {"Content-Encoding": name, "Content-Type": "application/json"}
    return web.Response(body=encode(body), headers=headers)


def completion(reason: str) -> bytes:
    return json.dumps(chat_completion(json.dumps({"relevant": True, "reason": reason}))).encode()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pl.DataFrame({"id": ["a"], "query": ["q"], "contexts": [["c1", "c2"]]}).write_parquet(path)
    return path


@pytest.fixture
def judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., HostileJudge]]:
    """Start a hostile judge answering with `answer`; the OpenAI variables point at it."""
    started: list[HostileJudge] = []

    def start(answer: Callable[[str, dict[str, Any]], Any]) -> HostileJudge:
        server = HostileJudge(answer).__enter__()
        started.append(server)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_a_compressed_reply_is_read(
    kind: str, source: Path, tmp_path: Path, judge: Callable[..., HostileJudge]
) -> None:
    judge(lambda path, body: encoded(kind, json.dumps(chat_completion(VERDICT)).encode()))
    out = tmp_path / "out"
    assert score(source, "-o", out, "--model", "openai/judge-1", "--no-memo") == 0
    assert pl.read_parquet(out / "*.parquet")["verdicts"].to_list() == [[True, True]]


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_a_compressed_reply_over_the_cap_is_a_failed_call_as_a_plain_one(
    kind: str,
    source: Path,
    tmp_path: Path,
    judge: Callable[..., HostileJudge],
    capsys: pytest.CaptureFixture[str],
) -> None:
    big = completion("x" * (10 << 20))  # 10 MB that compresses to a few KB
    server = judge(lambda path, body: encoded(kind, big))
    out = tmp_path / "out"
    code = score(source, "-o", out, "--model", "openai/judge-1", "--no-memo")
    err = capsys.readouterr().err
    assert code == 1, err
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["status"].to_list() == ["failed"]
    assert "reply over 4,194,304 bytes" in str(rows["error"][0])
    assert len(server.bodies) == 2  # one call an item: not retried, never re-asked
    assert all(len(json.dumps(b)) < 20_000 for b in server.bodies)


def test_the_judge_is_told_which_encodings_ctxprec_reads(
    source: Path, tmp_path: Path, judge: Callable[..., HostileJudge]
) -> None:
    seen: list[str] = []

    def answer(path: str, body: dict[str, Any]) -> str:
        return VERDICT

    server = judge(answer)
    server.on_request = lambda request: seen.append(request.headers.get("Accept-Encoding", ""))
    assert score(source, "-o", tmp_path / "out", "--model", "openai/judge-1", "--no-memo") == 0
    assert seen
    assert {v.replace(" ", "") for v in seen} == {"gzip,deflate"}


@pytest.mark.parametrize("name", ["br", "zstd", "compress", "gzip, gzip"])
def test_an_encoding_not_asked_for_is_a_failed_call_naming_it(
    name: str, source: Path, tmp_path: Path, judge: Callable[..., HostileJudge]
) -> None:
    headers = {"Content-Encoding": name, "Content-Type": "application/json"}
    judge(lambda path, body: web.Response(body=b"\x0b\x02\x80{}\x03", headers=headers))
    out = tmp_path / "out"
    assert score(source, "-o", out, "--model", "openai/judge-1", "--no-memo") == 1
    error = str(pl.read_parquet(out / "*.parquet")["error"][0])
    assert f"Content-Encoding {name!r}" in error


_BOMB_SERVER = """
import asyncio, socket, sys, zlib
from aiohttp import web

z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
head = b'{"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "'
parts = [z.compress(head)]
for _ in range(int(sys.argv[1]) >> 20):
    parts.append(z.compress(b" " * (1 << 20)))
BODY = b"".join([*parts, z.compress(b'"}}]}'), z.flush()])
seen = []

async def handle(request):
    seen.append(len(await request.read()))
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    return web.Response(body=BODY, headers=headers)

async def sizes(request):
    return web.json_response({"compressed": len(BODY), "requests": seen})

async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/sizes", sizes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_a_decompression_bomb_is_stopped_at_the_cap(tmp_path: Path) -> None:
    """A gzip body expanding to 256 MiB: `ctxprec score` (its own process) stops reading at
    the cap; its peak memory stays far below the expanded size, and the judge is asked once
    an item (no retry, no re-ask carrying the reply back)."""
    source = tmp_path / "in.parquet"
    pl.DataFrame(
        {"id": ["a", "b"], "query": ["q", "q"], "contexts": [["c1"], ["c2"]]}
    ).write_parquet(source)
    server = subprocess.Popen(
        [sys.executable, "-c", _BOMB_SERVER, str(256 << 20)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": KEY, "NO_PROXY": "127.0.0.1"}
        argv = [sys.executable, "-m", "ctxprec", "score", str(source), "-o", str(tmp_path / "out")]
        argv += [
            "--model",
            "openai/judge-1",
            "--no-memo",
            "--progress",
            "off",
            "--concurrency",
            "1",
        ]
        with open(tmp_path / "stderr", "w+") as log:
            child = subprocess.Popen(argv, cwd=REPO, env=env, stderr=log, text=True)
            peak_kib = high_water_kib(child)
            log.seek(0)
            err = log.read()
        with urllib.request.urlopen(url.removesuffix("/v1") + "/sizes", timeout=10) as reply:
            sizes = json.load(reply)
    finally:
        server.kill()
        server.wait()
    assert child.returncode == 1, err
    assert "Traceback" not in err
    rows = pl.read_parquet(tmp_path / "out" / "*.parquet")
    assert rows["status"].to_list() == ["failed", "failed"]
    assert all("reply over" in e for e in rows["error"].to_list())
    assert sizes["compressed"] < 1 << 20
    assert len(sizes["requests"]) == 2  # one call an item
    assert max(sizes["requests"]) < 20_000  # no request carried the reply back
    assert peak_kib < 200 << 10, f"peak RSS {peak_kib >> 10} MiB"  # the reply expands to 256


async def test_a_streamed_download_is_decoded_in_bounded_blocks() -> None:
    """Batch result files come through `stream`: gzip or not, the blocks given are the decoded
    body, none over 1 MiB (a 64 MiB body of one repeated line compresses to ~64 KB)."""
    lines = b'{"custom_id": "a", "ok": true}\n' * ((64 << 20) // 31)
    app = web.Application()

    async def handle(request: web.Request) -> web.Response:
        return encoded("gzip", lines)

    app.router.add_get("/file", handle)
    runner, root = await start_loopback(app, 0)
    transport = AiohttpTransport(30.0, per_read=True, max_reply_bytes=1000)
    try:
        total, largest = 0, 0
        async with transport.stream(HttpRequest("GET", f"{root}/file", {}, content=b"")) as reply:
            assert reply.status == 200
            async for block in reply.blocks:
                total += len(block)
                largest = max(largest, len(block))
    finally:
        await transport.aclose()
        await runner.cleanup()
    assert total == len(lines)
    assert largest <= 1 << 20
