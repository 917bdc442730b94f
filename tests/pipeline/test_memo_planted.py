"""A memo folder (or an OUTDIR's batch memo) is untrusted: a planted entry runs nothing and is a
miss, judged again, counted and named once; a read-only memo is used; a database of another
shape is refused in one line. The real CLI, the offline judge and the
real diskcache."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diskcache
import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.files import layout
from tests.fakes.inputs import REPO, SAMPLE
from tests.fakes.runs import score

ITEMS = 34  # context items of examples/sample.parquet (checked by the first run)


class _Marker:
    """A pickle that, unpickled, creates a file (the planted-pickle attack)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (os.system, (f"touch {self.path}",))


def _run(out: Path, cache: Path, *flags: str) -> dict[str, Any]:
    rc = score(SAMPLE, "-o", out, "--model", "offline", "--cache-dir", cache, *flags)
    run = json.loads(layout.run_info(out).read_text(encoding="utf-8"))
    run["rc"] = rc
    return run


def _keys(cache: Path) -> list[str]:
    with sqlite3.connect(cache / "cache.db") as con:
        return sorted(k for (k,) in con.execute("SELECT key FROM Cache"))


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    cache = tmp_path / "memo"
    first = _run(tmp_path / "first", cache)
    assert first["rc"] == 0
    assert (first["judge_calls"], first["memo_hits"]) == (ITEMS, 0)
    return cache


def _planted(cache: Path, marker: Path) -> int:
    """Plant, for keys the next run reads: pickles through diskcache's own `set`, pickles by
    raw SQL claiming pickle mode and raw mode, forged bytes of the right type but not a verdict,
    text, and rows naming files outside the folder (one a pickle). How many were planted."""
    keys = _keys(cache)
    evil = pickle.dumps(_Marker(marker))
    outside = cache.parent / "outside.val"
    outside.write_bytes(evil)
    with diskcache.Cache(str(cache)) as dc:
        dc.set(keys[0], _Marker(marker))
        dc.set(keys[1], (True, "forged by diskcache's pickle", 1, 1))
    header = struct.Struct("<4sBQQ")
    forged: list[tuple[int, str | None, Any]] = [
        (4, None, evil),  # mode pickle, inline
        (1, None, evil),  # mode raw, the bytes a pickle
        (1, None, header.pack(b"cpv2", 7, 1, 1) + b"relevant"),  # flag neither 0 nor 1
        (1, None, header.pack(b"cpv2", 1, 1, 1) + b"\xff\xfe bad utf-8"),
        (1, None, header.pack(b"cpv2", 1, 2**60, 1) + b"tokens"),  # past the token bound
        (1, None, header.pack(b"cpv2", 1, 1, 1) + b"r" * 40_000),  # a huge reason
        (1, None, b"cpv"),  # too short
        (1, None, '[true, "json text", 1, 1]'),  # text, not bytes
        (1, None, header.pack(b"CPV1", 1, 1, 1) + b"wrong magic"),
        (4, str(outside), None),  # a file-backed pickle outside the folder
        (2, "../outside.val", None),  # a file-backed bytes value, relative, outside
    ]
    with sqlite3.connect(cache / "cache.db") as con:
        for key, (mode, filename, value) in zip(keys[2:], forged, strict=False):
            con.execute(
                "UPDATE Cache SET mode = ?, filename = ?, value = ? WHERE key = ?",
                (mode, filename, value, key),
            )
    return 2 + len(forged)


def test_planted_entries_run_nothing_and_are_judged_again(filled: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    planted = _planted(filled, marker)
    second = _run(tmp_path / "second", filled)
    assert not marker.exists()
    assert second["rc"] == 0
    assert second["judge_calls"] == planted
    assert second["memo_hits"] == ITEMS - planted
    assert second["memo_unreadable"] == planted
    notes = [n for n in second["notices"] if "could not be read as verdicts" in n]
    assert notes == [f"memo: {planted} entries could not be read as verdicts; judged again"]
    # the same scores as the first run: no forged verdict counted
    first = _scores(tmp_path / "first")
    assert _scores(tmp_path / "second") == first
    third = _run(tmp_path / "third", filled)  # the entries judged again were stored right
    assert (third["judge_calls"], third["memo_hits"], third["memo_unreadable"]) == (0, ITEMS, 0)
    assert (tmp_path / "outside.val").exists()  # a file a row named is never opened nor removed


def _scores(out: Path) -> dict[str, Any]:
    table = pl.read_parquet(out / "*.parquet")
    return dict(zip(table["id"].to_list(), table["score"].to_list(), strict=True))


def test_planted_batch_memo_in_outdir_runs_nothing_even_with_no_memo(tmp_path: Path) -> None:
    """The batch memo inside OUTDIR is read the same safe way: a copied OUTDIR with a planted
    pickle in `_ctxprec/batch-memo` runs nothing, with --no-memo too."""
    from ctxprec.batchapi.collect import BatchCollector

    folder = tmp_path / "out" / "_ctxprec" / "batch-memo"
    memo = _collector_memo(BatchCollector, tmp_path / "out")
    memo.set_many([("v2-a", (True, "kept", 1, 1)), ("v2-b", (False, "kept", 1, 1))])
    memo.close()
    marker = tmp_path / "marker"
    with diskcache.Cache(str(folder)) as dc:
        dc.set("v2-a", _Marker(marker))
    with sqlite3.connect(folder / "cache.db") as con:
        con.execute("UPDATE Cache SET value = ? WHERE key = 'v2-b'", (b"cpv2\x01forged",))
    memo = _collector_memo(BatchCollector, tmp_path / "out")
    assert memo.get_many(["v2-a", "v2-b"]) == {}
    assert memo.unreadable == 2
    memo.close()
    assert not marker.exists()


def _collector_memo(cls: Any, outdir: Path) -> Any:
    """`BatchCollector.open_memo` with the memo off (--no-memo), as a batch run opens it."""
    from ctxprec.config import load_config

    collector = cls.__new__(cls)
    collector.cfg = load_config(None, {"run.memo": False})
    collector.outdir = outdir
    return collector.open_memo()


def test_a_memo_of_another_shape_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "memo"
    cache.mkdir()
    with sqlite3.connect(cache / "cache.db") as con:
        con.execute("CREATE TABLE Cache (key TEXT, value BLOB)")
        con.execute("CREATE TABLE Settings (key TEXT, value)")
    rc = score(SAMPLE, "-o", tmp_path / "out", "--model", "offline", "--cache-dir", cache)
    err = capsys.readouterr().err
    assert rc == 2
    assert f"the memo folder {cache} cannot be used" in err
    assert "--cache-dir" in err
    assert "--no-memo" in err
    assert "Traceback" not in err
    (cache / "cache.db").write_bytes(b"not a database at all" * 100)
    assert main(["cache", "info", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "is not an SQLite database" in err
    assert "Traceback" not in err
    # --no-memo is the way out
    rc = score(SAMPLE, "-o", tmp_path / "out2", "--model", "offline", "--no-memo")
    assert rc == 0


def _read_only(folder: Path) -> list[str]:
    """A command prefix that runs with `folder` read-only: chmod for a user, a read-only bind
    mount in a private mount namespace for root (whom chmod does not stop)."""
    if os.geteuid() != 0:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("root, and no unshare(1) to mount the memo read-only")
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind -o ro {folder} {folder} && touch {folder}/x"],
        capture_output=True,
        text=True,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"root, and no read-only bind mount here: {probe.stderr.strip()}")
    return ["unshare", "-m", "sh", "-c", f'mount --bind -o ro {folder} {folder} && exec "$@"', "-"]


def _cli(prefix: list[str], *args: object) -> subprocess.CompletedProcess[str]:
    cmd = [*prefix, sys.executable, "-m", "ctxprec", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_read_only_memo_is_used_and_cache_info_works(filled: Path, tmp_path: Path) -> None:
    prefix = _read_only(filled)
    out = tmp_path / "ro-out"
    done = _cli(prefix, "score", SAMPLE, "-o", out, "--model", "offline", "--cache-dir", filled,
                "--progress", "off")  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(layout.run_info(out).read_text(encoding="utf-8"))
    assert (run["judge_calls"], run["memo_hits"]) == (0, ITEMS)
    line = f"memo {filled} is read-only: verdicts it holds are used, new ones are not kept"
    assert run["notices"].count(line) == 1
    assert line in done.stdout + done.stderr
    info = _cli(prefix, "cache", "info", "--cache-dir", filled)
    assert info.returncode == 0, info.stderr
    assert f"{ITEMS} verdicts" in info.stdout
    assert "read-only" in info.stdout
    # a run that needs new verdicts still finishes; they are not kept
    other = tmp_path / "other.parquet"
    table = pl.read_parquet(SAMPLE)
    table.with_columns(pl.col("query") + " (again)").write_parquet(other)
    for attempt in ("ro-2", "ro-3"):
        again = _cli(prefix, "score", other, "-o", tmp_path / attempt, "--model", "offline",
                     "--cache-dir", filled, "--progress", "off")  # fmt: skip
        assert again.returncode == 0, again.stderr
        run = json.loads(layout.run_info(tmp_path / attempt).read_text(encoding="utf-8"))
        assert (run["judge_calls"], run["memo_hits"]) == (ITEMS, 0)
    cleared = _cli(prefix, "cache", "clear", "--cache-dir", filled)
    assert cleared.returncode == 2
    assert "read-only: nothing removed" in cleared.stderr
    assert "Traceback" not in cleared.stderr


def test_old_format_verdicts_are_named_until_cache_clear_old_format_removes_only_them(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verdicts of the v1 recipe (pickled values) are never read; the note that says so names
    the command that removes them, which removes those rows and no v2 verdict."""
    current = _keys(filled)
    with sqlite3.connect(filled / "cache.db") as con:
        for n in range(3):
            value = pickle.dumps((True, f"old {n}", 1, 1))
            con.execute(
                "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
                " tag, size, mode, filename, value) VALUES (?, 1, 1.0, NULL, 1.0, 0, NULL, 0, 4,"
                " NULL, ?)",
                (f"v1-{n:064x}", value),
            )
    note = "`ctxprec cache clear --old-format` removes them"
    assert main(["cache", "info", "--cache-dir", str(filled)]) == 0
    assert note in capsys.readouterr().out
    run = _run(tmp_path / "again", filled)
    assert (run["rc"], run["judge_calls"], run["memo_hits"]) == (0, 0, ITEMS)
    assert any(note in line for line in run["notices"])
    assert main(["cache", "info", "--old-format", "--cache-dir", str(filled)]) == 2
    assert "--old-format is for `ctxprec cache clear`" in capsys.readouterr().err
    assert main(["cache", "clear", "--old-format", "--yes", "--cache-dir", str(filled)]) == 0
    said = capsys.readouterr().out
    assert f"removed 3 verdicts of memo formats before v2 from {filled}; {ITEMS} left" in said
    assert _keys(filled) == current
    assert main(["cache", "info", "--cache-dir", str(filled)]) == 0
    assert "memo format v2" not in capsys.readouterr().out
    run = _run(tmp_path / "third", filled)
    assert (run["rc"], run["memo_hits"]) == (0, ITEMS)
    assert not any("memo format v2" in line for line in run["notices"])
