"""The `ctxprec view` web server (aiohttp): a fixed set of routes, nothing from a URL ever mapped
to a file. The row-table page and its two assets are package data read once at start; the
report files (summary.html) are read by their fixed names from the output, each a regular file
opened through no link (O_NOFOLLOW, and O_NONBLOCK so that a FIFO put in its place cannot block a
thread), fstat'ed and size-capped; every answer under /api/ is a query over the part files, run
in a worker thread so the server stays responsive. What every reply and connection is held to
(headers, aiohttp's own error replies, the header timeout, the connection cap) is
`ctxprec.view.wire`'s.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Any

import anyio
import anyio.to_thread
from aiohttp import web

from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files import layout
from ctxprec.storage.files.confine import read_regular
from ctxprec.storage.files.objpath import ObjPath, OutPath
from ctxprec.storage.report.pairs import PAIR_SORTS, RowPairs
from ctxprec.storage.report.summary import BANDS
from ctxprec.storage.report.table import SORTS, STATUSES, RowTable
from ctxprec.view.params import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_VALUE,
    BadRequest,
    known,
    page_params,
    pair_filter,
    row_filter,
    side,
)
from ctxprec.view.wire import (
    PAGE_CSP,
    REPORT_CSP,
    error_reply,
    json_reply,
    protocols,
    secured,
)

__all__ = [
    "ASSETS",
    "MAX_REPORT_BYTES",
    "PAGE_CSP",
    "REPORT_CSP",
    "build_app",
    "is_loopback",
    "read_report",
    "report_problem",
    "serve",
    "url_of",
]

log = logging.getLogger("ctxprec.view")

ASSETS = {  # route -> (file in pipeline/view/assets, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/view.js": ("view.js", "text/javascript; charset=utf-8"),
    "/view.css": ("view.css", "text/css; charset=utf-8"),
}
QUERY_THREADS = 2  # Polars queries at once (each uses every core); others wait their turn
MAX_REPORT_BYTES = 64 << 20  # a summary.html or summary.json the viewer serves or reads, at most


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class _State:
    tables: list[RowTable]
    pairs: RowPairs | None
    assets: dict[str, bytes]
    info: dict[str, Any] = field(default_factory=dict)
    limiter: anyio.CapacityLimiter | None = None
    allowed_hosts: set[str] | None = None  # Host headers accepted (None: any, for --host)


_STATE = web.AppKey("state", _State)


def _asset_bytes() -> dict[str, bytes]:
    folder = resources.files("ctxprec.view").joinpath("assets")  # package data, not OUTDIR
    return {route: (folder / name).read_bytes() for route, (name, _) in ASSETS.items()}


def build_app(tables: Sequence[RowTable], *, loopback_only: bool = True) -> web.Application:
    """The application serving `tables` (one output, or A and B). With `loopback_only` a
    request must name the server by a loopback Host (no DNS-rebinding page can query it)."""
    app = web.Application(middlewares=[_guard])
    pairs = RowPairs(tables[0], tables[1]) if len(tables) == 2 else None
    app[_STATE] = _State(list(tables), pairs, _asset_bytes())
    app[_STATE].allowed_hosts = set() if loopback_only else None
    for route in ASSETS:
        app.router.add_get(route, _asset)
    app.router.add_get("/summary.html", partial(_report, 0))
    app.router.add_get("/b/summary.html", partial(_report, 1))
    app.router.add_get("/api/info", _info)
    app.router.add_get("/api/rows", _rows)
    app.router.add_get("/api/row/{id:.+}", _row)
    app.router.add_get("/api/compare", _compare)
    app.router.add_get("/api/pair/{id:.+}", _pair)
    app.on_startup.append(_startup)
    return app


def allow_hosts(app: web.Application, host: str, port: int) -> None:
    """The Host headers a loopback server answers to, once its port is known."""
    state = app[_STATE]
    if state.allowed_hosts is not None:
        names = {host, "localhost", "127.0.0.1", "[::1]"}
        state.allowed_hosts = {f"{n}:{port}" for n in names}


async def _startup(app: web.Application) -> None:
    state = app[_STATE]
    state.limiter = anyio.CapacityLimiter(QUERY_THREADS)
    state.info = await _in_thread(state, partial(_describe, state))


def _describe(state: _State) -> dict[str, Any]:
    """What the page needs before its first query: the outputs, their figures and filters."""
    outputs = []
    for i, table in enumerate(state.tables):
        outputs.append(
            {
                "side": "ab"[i],
                "outdir": str(table.outdir),
                "rows": table.count_all(),
                "summary": _headline(table.summary()),
                "summary_html": layout.summary_html(table.outdir).is_file(),
                "query_column": table.query_column,
                "search_note": table.search_note,
                "texts": table.context_column is not None,
                "groups": table.group_values(),
                "judge_model": table.describe.get("judge_model"),
            }
        )
    info: dict[str, Any] = {
        "outputs": outputs,
        "statuses": list(STATUSES),
        "bands": [{"band": b, "range": span, "meaning": m} for b, _, _, span, m in BANDS],
        "sorts": list(SORTS),
        "page_size": {"default": DEFAULT_PAGE_SIZE, "max": MAX_PAGE_SIZE},
    }
    if state.pairs is not None:
        info["compare"] = {**state.pairs.counts(), "sorts": list(PAIR_SORTS)}
    return info


def _headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of summary.json the page shows (as written there, not recomputed)."""
    keys = ("rows", "coverage", "score", "bands", "scale", "by_group")
    return {k: summary[k] for k in keys if k in summary}


async def _in_thread(state: _State, fn: Callable[[], Any]) -> Any:
    """`fn` in a query thread. A stop (Ctrl-C, SIGTERM) abandons a thread still blocked in a
    read (a file swapped for a FIFO after it was checked), so the server always stops."""
    return await anyio.to_thread.run_sync(fn, limiter=state.limiter, abandon_on_cancel=True)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Host check, JSON errors, and the security headers on every answer."""
    allowed = request.app[_STATE].allowed_hosts
    if allowed is not None and request.host not in allowed:
        response: web.StreamResponse = error_reply(
            421, "unknown Host; open the URL ctxprec printed"
        )
    else:
        try:
            response = await handler(request)
        except BadRequest as exc:
            response = error_reply(400, str(exc))
        except web.HTTPException as exc:
            reason = "not found" if exc.status == 404 else exc.reason
            response = error_reply(exc.status, reason)
            if exc.status == 405:
                response.headers["Allow"] = "GET, HEAD"
        except Exception as exc:  # a part file that went away, a damaged file: said, not raised
            log.warning("view: %s failed: %r", request.path, exc)
            response = error_reply(500, f"the query failed: {type(exc).__name__}: {exc}"[:500])
    csp = REPORT_CSP if request.path.endswith("summary.html") else PAGE_CSP
    return secured(response, csp)


async def _asset(request: web.Request) -> web.Response:
    if request.query:
        known(request.query, frozenset())
    body = request.app[_STATE].assets[request.path]
    return web.Response(
        body=body, content_type=ASSETS[request.path][1].split(";")[0], charset="utf-8"
    )


async def _report(index: int, request: web.Request) -> web.Response:
    """OUTDIR/summary.html (of A, or of B at /b/summary.html) when the output holds one."""
    state = request.app[_STATE]
    if index >= len(state.tables):
        raise web.HTTPNotFound()
    path = layout.summary_html(state.tables[index].outdir)
    body = await _in_thread(state, partial(read_report, path))
    if body is None:
        raise web.HTTPNotFound()
    return web.Response(body=body, content_type="text/html", charset="utf-8")


def read_report(path: OutPath, cap: int = MAX_REPORT_BYTES) -> bytes | None:
    """The bytes of a report file of the output, or None when it is missing or is not a
    regular file of at most `cap` bytes: opened through no link and without blocking (a FIFO),
    checked on the open file, read no further than the cap."""
    try:
        if isinstance(path, ObjPath):  # an object store: no links, no FIFOs
            if path.stat().st_size > cap:
                return None
            data: bytes = path.read_bytes()
            return data if len(data) <= cap else None
        return read_regular(path, cap)
    except (OSError, ValueError):
        return None


def report_problem(outdir: OutPath) -> str | None:
    """Why the report files of `outdir` (summary.html, summary.json) cannot be served as they
    are, in words naming the file; None when each is missing or a regular file within the cap."""
    if isinstance(outdir, ObjPath):
        return None
    for path in (layout.summary_html(outdir), layout.summary_json(outdir)):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path} cannot be inspected ({exc.strerror})"
        if stat.S_ISLNK(info.st_mode):
            what = "a symbolic link"
        elif not stat.S_ISREG(info.st_mode):
            what = "not a regular file"
        elif info.st_size > MAX_REPORT_BYTES:
            what = f"larger than {MAX_REPORT_BYTES >> 20} MiB"
        else:
            continue
        return (
            f"{path} is {what}; ctxprec view serves only regular files inside the output: "
            f"remove it, then `ctxprec summary {outdir}` writes the report again"
        )
    return None


async def _info(request: web.Request) -> web.Response:
    known(request.query, frozenset())
    return json_reply(request.app[_STATE].info)


async def _rows(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    table = side(request.query, state.tables)
    found, sort = row_filter(request.query, table)
    number, size = page_params(request.query)
    return json_reply(await _in_thread(state, partial(table.page, found, sort, number, size)))


def _row_id(request: web.Request) -> str:
    row_id = request.match_info["id"]
    if len(row_id) > MAX_VALUE:
        raise BadRequest(f"an id of {len(row_id):,} characters; at most {MAX_VALUE}")
    return row_id


async def _row(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    known(request.query, frozenset({"side"}))
    table = side(request.query, state.tables)
    row_id = _row_id(request)
    got = await _in_thread(state, partial(table.row, row_id))
    return error_reply(404, "no row with this id") if got is None else json_reply(got)


def _pairs(request: web.Request) -> RowPairs:
    pairs = request.app[_STATE].pairs
    if pairs is None:
        raise BadRequest("compare needs two outputs: ctxprec view OUTDIR_A OUTDIR_B")
    return pairs


async def _compare(request: web.Request) -> web.Response:
    state, pairs = request.app[_STATE], _pairs(request)
    found, sort = pair_filter(request.query)
    number, size = page_params(request.query)
    return json_reply(await _in_thread(state, partial(pairs.page, found, sort, number, size)))


async def _pair(request: web.Request) -> web.Response:
    state, pairs = request.app[_STATE], _pairs(request)
    known(request.query, frozenset())
    got = await _in_thread(state, partial(pairs.pair, _row_id(request)))
    return (
        error_reply(404, "no row with this id on either side") if got is None else json_reply(got)
    )


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


async def serve(
    tables: Sequence[RowTable],
    host: str,
    port: int,
    *,
    loopback_only: bool,
    started: Callable[[str], None],
    seams: Seams = DEFAULT,
) -> None:
    """Serve until cancelled (Ctrl-C: `ctxprec.run.interrupt.stoppable`), then close every
    connection. `started` gets the URL once the port is bound (port 0: a free one)."""
    app = build_app(tables, loopback_only=loopback_only)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        loop = asyncio.get_running_loop()
        assert runner.server is not None
        try:
            listener = await loop.create_server(
                protocols(runner.server, loop, seams), host, port, reuse_address=True
            )
        except OSError as exc:
            raise UserError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another "
                "--port, or --port 0 for a free one"
            ) from None
        try:
            bound = _bound_port(listener, port)
            allow_hosts(app, host, bound)
            started(url_of(host, bound))
            await anyio.sleep_forever()
        finally:
            listener.close()  # no new connection; the open ones are closed by the cleanup
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


def _bound_port(listener: asyncio.Server, asked: int) -> int:
    for sock in listener.sockets:
        address = sock.getsockname()
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked
