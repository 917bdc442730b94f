"""`ctxprec view` as a real server (a subprocess on a free loopback port): its JSON API searches,
filters, sorts and pages the whole row table and pairs two outputs; it serves a fixed set of
routes and nothing else (no path from a URL reaches the filesystem); it validates every
parameter; Ctrl-C stops it with exit 130 and it has written nothing."""

from __future__ import annotations

import http.client
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import polars as pl
import pytest

from ctxprec.storage.core.metric import average_precision, round_half_up
from tests.fakes.inputs import REPO, SAMPLE
from tests.fakes.viewer import HOSTILE, Viewer, get, make_outputs, tree_digest, viewer
from tests.test_readme import documented_commands


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_outputs(tmp_path_factory.mktemp("view"))


@pytest.fixture(scope="module")
def server(outputs: tuple[Path, Path]) -> Iterator[Viewer]:
    with viewer(*outputs) as running:
        yield running


def api(server: Viewer, path: str, **params: Any) -> Any:
    query = f"?{urlencode(params)}" if params else ""
    status, _, body = get(server.url.rstrip("/") + path + query)
    assert status == 200, body
    return body


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def test_info_carries_summary_json_figures(server: Viewer, outputs: tuple[Path, Path]) -> None:
    info = api(server, "/api/info")
    assert [o["outdir"] for o in info["outputs"]] == [str(o) for o in outputs]
    for out, shown in zip(outputs, info["outputs"], strict=True):
        s = summary(out)
        assert shown["rows"] == s["rows"]["total"] == 16
        assert shown["summary"]["score"]["mean"] == s["score"]["mean"]
        assert shown["query_column"] == "query"
        assert shown["texts"] is True
        assert {g["value"] for g in shown["groups"]["retriever"]} >= {"bm25", "dense"}
    assert info["compare"]["pairs"] == 16


def test_pages_cover_every_row_once(server: Viewer) -> None:
    seen: list[str] = []
    for page in (1, 2, 3, 4):
        got = api(server, "/api/rows", size=5, page=page)
        assert got["total"] == 16
        seen += [r["id"] for r in got["rows"]]
    assert len(seen) == len(set(seen)) == 16
    assert api(server, "/api/rows", size=5, page=9)["rows"] == []


def test_search_by_id_and_query_text(server: Viewer) -> None:
    assert [r["id"] for r in api(server, "/api/rows", q="q007")["rows"]] == ["q007"]
    found = api(server, "/api/rows", q="BERLIN wall")["rows"]
    assert [r["id"] for r in found] == ["q008"]
    assert api(server, "/api/rows", q="<script>")["total"] == 1  # literal, not a pattern
    assert api(server, "/api/rows", q=".*")["total"] == 0


def test_an_output_without_its_query_text_says_search_matches_ids_only(tmp_path: Path) -> None:
    """Scored without --passthrough of the query, the output cannot be searched by query
    text: the page's info and every search's answer say so, instead of 0 rows in silence."""
    src = tmp_path / "in.parquet"
    pl.read_parquet(SAMPLE).write_parquet(src)
    out = tmp_path / "out"
    args = ["score", str(src), "-o", str(out), "--progress", "off", "--quiet"]
    done = subprocess.run([sys.executable, "-m", "ctxprec", *args], capture_output=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    note = (
        "this output keeps no query text, so a search matches ids only: score with "
        "--passthrough query to search the queries"
    )
    with viewer(out) as running:
        info = api(running, "/api/info")
        assert info["outputs"][0]["query_column"] is None
        assert info["outputs"][0]["search_note"] == note
        found = api(running, "/api/rows", q="berlin")
        assert (found["total"], found["note"]) == (0, note)
        assert api(running, "/api/rows", q="q007")["total"] == 1  # ids still match
        assert "note" not in api(running, "/api/rows")  # nothing searched, nothing to say


def test_filters_by_status_band_and_group(server: Viewer) -> None:
    empty = api(server, "/api/rows", status="empty_context")["rows"]
    assert [r["status"] for r in empty] == ["empty_context"]
    none = api(server, "/api/rows", band="none")["rows"]
    assert none
    assert all(r["score"] == 0 for r in none)
    excellent = api(server, "/api/rows", band="excellent", size=200)["rows"]
    assert excellent
    assert all(r["score"] >= 0.9 for r in excellent)
    dense = api(server, "/api/rows", group_by="retriever", group="dense")
    assert dense["total"] == 6
    assert {r["retriever"] for r in dense["rows"]} == {"dense"}
    both = api(server, "/api/rows", group_by="retriever", group="dense", band="none")
    assert 0 < both["total"] < dense["total"]


def test_sorts_by_score_both_ways_and_by_id(server: Viewer) -> None:
    up = [r["score"] for r in api(server, "/api/rows", sort="score", size=200)["rows"]]
    down = [r["score"] for r in api(server, "/api/rows", sort="-score", size=200)["rows"]]
    assert up == sorted(up)
    assert down == sorted(down, reverse=True)
    assert len(up) == 16
    ids = [r["id"] for r in api(server, "/api/rows", sort="id", size=200)["rows"]]
    assert ids == sorted(ids)
    # a sorted page is the matching slice of the whole sorted table
    second = api(server, "/api/rows", sort="-score", size=5, page=2)["rows"]
    assert [r["score"] for r in second] == down[5:10]


def test_a_row_opens_to_its_ranked_items(server: Viewer) -> None:
    row = api(server, "/api/row/q001")
    assert row["id"] == "q001"
    assert len(row["items"]) == 4
    verdicts = [i["verdict"] for i in row["items"]]
    gains = [i["gain"] or 0 for i in row["items"]]
    assert math.isclose(sum(gains), average_precision(verdicts))
    assert round_half_up(sum(gains)) == row["score"]
    assert all(i["text"] for i in row["items"])  # --passthrough contexts: the texts too
    hostile = api(
        server, "/api/row/" + quote(api(server, "/api/rows", q="Hostile 0")["rows"][0]["id"])
    )
    assert hostile["items"][1]["text"] == HOSTILE[0]  # as it is: escaping is the page's job
    b = api(server, "/api/row/q001", side="b")
    assert [i["verdict"] for i in b["items"]] == verdicts[::-1]


def test_two_outputs_pair_on_id(server: Viewer) -> None:
    page = api(server, "/api/compare", sort="delta", size=200)
    assert page["total"] == 16
    deltas = [r["delta"] for r in page["rows"]]
    assert deltas == sorted(deltas)
    for r in page["rows"]:
        assert math.isclose(r["delta"], round(r["score_b"] - r["score_a"], 4))
    changed = api(server, "/api/compare", changed="1", size=200)
    assert 0 < changed["total"] < 16
    assert all(r["delta"] != 0 for r in changed["rows"])
    moved = changed["rows"][0]["id"]
    pair = api(server, "/api/pair/" + quote(moved))
    assert pair["a"]["id"] == pair["b"]["id"] == moved
    assert math.isclose(pair["delta"], pair["b"]["score"] - pair["a"]["score"])
    assert [i["text"] for i in pair["a"]["items"]] == [i["text"] for i in pair["b"]["items"]][::-1]


BAD_QUERIES = [
    "/api/rows?status=bogus",
    "/api/rows?band=great",
    "/api/rows?size=201",
    "/api/rows?size=0",
    "/api/rows?page=0",
    "/api/rows?page=-1",
    "/api/rows?page=1e3",
    "/api/rows?page=%EF%BC%91",  # a full-width digit one
    "/api/rows?page=99999999999999999999",
    "/api/rows?sort=score;drop",
    "/api/rows?side=c",
    "/api/rows?group=dense",
    "/api/rows?group_by=judge_model&group=x",
    "/api/rows?q=" + "x" * 201,
    "/api/rows?path=/etc/passwd",
    "/api/compare?changed=yes",
    "/api/compare?band=none",
    "/api/info?x=1",
]


@pytest.mark.parametrize("path", BAD_QUERIES)
def test_bad_parameters_are_400_json(server: Viewer, path: str) -> None:
    status, headers, body = get(server.url.rstrip("/") + path)
    assert status == 400, body
    assert body["status"] == 400
    assert body["error"]
    assert headers["X-Content-Type-Options"] == "nosniff"


def raw_get(server: Viewer, path: str, method: str = "GET") -> tuple[int, bytes]:
    """One request with `path` sent exactly as written (no client-side normalising)."""
    where = urlsplit(server.url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    conn.putrequest(method, path, skip_accept_encoding=True)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


TRAVERSALS = [
    "/../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/..%2f..%2f..%2fetc%2fpasswd",
    "/%2F%2Fetc%2Fpasswd",
    "//etc/passwd",
    "/etc/passwd",
    "/api/row/..%2F..%2F..%2Fetc%2Fpasswd",
    "/api/row/../../etc/passwd",
    "/summary.html/../_ctxprec/manifest.json",
    "/_ctxprec/manifest.json",
    "/_ctxprec/",
    "/summary.json",
    "/part-00000-00000.parquet",
    "/b/../summary.json",
    "/view.js/..%2f..%2fsummary.json",
    "/assets/view.js",
    "/pipeline/view/assets/view.js",
    "/index.html",
    "/favicon.ico",
    "/api/",
    "/api/rows/..",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_no_url_reaches_a_file(server: Viewer, path: str, outputs: tuple[Path, Path]) -> None:
    status, body = raw_get(server, path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body
    assert b"PAR1" not in body
    assert b"fingerprint" not in body
    assert b'"score":' not in body
    assert (outputs[0] / "_ctxprec" / "manifest.json").read_bytes() not in body


def test_fixed_routes_only_get(server: Viewer) -> None:
    status, body = raw_get(server, "/")
    assert status == 200
    assert b"<title>ctxprec view</title>" in body
    assert raw_get(server, "/", "POST")[0] == 405
    assert raw_get(server, "/api/rows", "DELETE")[0] == 405


def test_security_headers_and_host_check(server: Viewer) -> None:
    for path in ("/", "/view.js", "/api/info", "/nothing"):
        _, headers, _ = get(server.url.rstrip("/") + path)
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, _, body = get(server.url + "api/info", {"Host": "attacker.example:80"})
    assert status == 421
    assert "Host" in body["error"]


def test_summary_html_is_served_from_the_output_when_present(tmp_path: Path) -> None:
    (a, _) = make_outputs(tmp_path)
    page = a / "summary.html"
    written = page.exists()
    if not written:  # an output from before summary.html: the route answers 404
        with viewer(a) as running:
            assert get(running.url + "summary.html")[0] == 404
            assert api(running, "/api/info")["outputs"][0]["summary_html"] is False
        page.write_text("<!doctype html><title>report</title><p>the report</p>")
    with viewer(a) as running:
        status, headers, body = get(running.url + "summary.html")
        assert status == 200
        assert body == page.read_text()
        assert "script-src" not in headers["Content-Security-Policy"]  # no script at all
        assert get(running.url + "b/summary.html")[0] == 404  # one output: no B


def test_ctrl_c_exits_130_and_nothing_is_written(tmp_path: Path) -> None:
    a, b = make_outputs(tmp_path)
    before = [tree_digest(a), tree_digest(b)]
    with viewer(a, b) as running:
        api(running, "/api/rows", sort="-score", q="q0")
        api(running, "/api/row/q003", side="b")
        api(running, "/api/compare", sort="change")
        code, err = running.stop()
    assert code == 130, err
    assert "stopped" in err
    assert "Traceback" not in err
    assert [tree_digest(a), tree_digest(b)] == before


def test_not_an_output_is_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctxprec.cli.main", "view", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2
    assert "holds no ctxprec output" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_documented_view_commands_run(tmp_path: Path) -> None:
    """Every `ctxprec view` command the README and docs/ show, as written but on a free port
    (tests/test_readme.py leaves them here: a server runs until Ctrl-C), over the output the
    README's first command writes."""
    shown = [c for _, c, _ in documented_commands() if c.startswith("ctxprec view")]
    assert any(c == "ctxprec view out/sample" for c in shown)
    score = ["score", str(REPO / "examples" / "sample.parquet"), "-o", "out/sample"]
    subprocess.run(
        [sys.executable, "-m", "ctxprec.cli.main", *score, "--progress", "off"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    for command in shown:
        args = [w if "/" not in w else str(tmp_path / w) for w in shlex.split(command)[2:]]
        with viewer(*args) as running:
            assert api(running, "/api/info")["outputs"][0]["rows"] == 12
