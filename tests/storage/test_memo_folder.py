"""A memo folder is reached as OUTDIR is: the folder itself, as given, is trusted; below it
nothing ctxprec reads, writes or removes is reached through a symbolic link or taken for
another kind of entry, and only files of ctxprec's own names are removed. A planted `journal`
link, database files that are links, FIFOs or folders, an open lock that is a link: each
refuses the folder in one line (exit 2) before anything is changed, inside or outside it."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.files.layout import journal_dir, journal_file, journal_new
from ctxprec.storage.memo.journal import open_journal, replay_journals
from ctxprec.storage.memo.store import Memo
from tests.fakes.inputs import write_input
from tests.fakes.runs import score

RECORD = ["v2-" + "a" * 64, True, "a reason", 3, 1]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (never followed): a file's bytes, a link's target, a folder."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "folder"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "other"
    return out


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """A user's folder of JSON Lines logs, one of them named as a journal would be."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "requests.jsonl").write_text('{"user": 1}\n')
    (folder / "0123456789abcdef.jsonl").write_text(json.dumps(RECORD) + "\n")
    (folder / ".new-0123456789abcdef").write_text(json.dumps(RECORD) + "\n")
    return folder


def _memo(tmp_path: Path) -> Path:
    """A memo folder a run has used (its database made, no journal left)."""
    folder = tmp_path / "memo"
    Memo(folder).close()
    return folder


PLANTS: dict[str, Callable[[Path, Path], None]] = {
    "journal link": lambda memo, logs: journal_dir(memo).symlink_to(logs),
    "journal file": lambda memo, logs: journal_dir(memo).write_text("not a folder\n"),
    "cache.db link": lambda memo, logs: _replace(memo / "cache.db", logs / "requests.jsonl"),
    "cache.db fifo": lambda memo, logs: _replace(memo / "cache.db", None),
    "cache.db folder": lambda memo, logs: _replace(memo / "cache.db", "folder"),
    "cache.db /dev/zero": lambda memo, logs: _replace(memo / "cache.db", Path("/dev/zero")),
    "wal link": lambda memo, logs: (memo / "cache.db-wal").symlink_to(logs / "requests.jsonl"),
    "rollback journal link": lambda memo, logs: (memo / "cache.db-journal").symlink_to(
        logs / "requests.jsonl"
    ),
    "open lock link": lambda memo, logs: _replace(
        memo / "ctxprec-open.lock", logs / "requests.jsonl"
    ),
    "open lock fifo": lambda memo, logs: _replace(memo / "ctxprec-open.lock", None),
}


def _replace(path: Path, by: Path | str | None) -> None:
    """`path` replaced by a link to `by`, a FIFO (None) or a folder ("folder")."""
    path.unlink(missing_ok=True)
    if by is None:
        os.mkfifo(path)
    elif by == "folder":
        path.mkdir()
    else:
        path.symlink_to(by)


def _one_line(code: int, err: str, memo: Path) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("ctxprec: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ctxprec: error: the memo folder {memo} cannot be used"), err
    assert "--no-memo" in lines[0], err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_entry_refuses_the_memo_folder_before_anything_changes(
    plant: str, logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memo = _memo(tmp_path)
    PLANTS[plant](memo, logs)
    before_logs, before_memo = _snapshot(logs), _snapshot(memo)
    source = write_input(tmp_path / "in.parquet", range(4))
    out = tmp_path / "out"
    capsys.readouterr()
    _one_line(score(source, "-o", out, "--cache-dir", memo), capsys.readouterr().err, memo)
    assert not out.exists()  # refused before the output folder was made
    for action in ("info", "clear"):
        code = main(["cache", action, "--cache-dir", str(memo)])
        _one_line(code, capsys.readouterr().err, memo)
    assert _snapshot(logs) == before_logs
    assert _snapshot(memo) == before_memo
    # --no-memo is the way out
    assert score(source, "-o", out, "--no-memo") == 0


def test_a_finished_output_is_not_touched_when_the_memo_folder_is_refused(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memo = _memo(tmp_path)
    source, out = write_input(tmp_path / "in.parquet", range(4)), tmp_path / "out"
    assert score(source, "-o", out, "--cache-dir", memo) == 0
    journal_dir(memo).symlink_to(logs)
    before = _snapshot(out)
    capsys.readouterr()
    _one_line(score(source, "-o", out, "--cache-dir", memo), capsys.readouterr().err, memo)
    assert _snapshot(out) == before  # `_SUCCESS` kept, the manifest not rewritten


def test_only_journals_of_ctxprecs_names_are_replayed_and_removed(
    tmp_path: Path, logs: Path
) -> None:
    memo_dir = _memo(tmp_path)
    folder = journal_dir(memo_dir)
    folder.mkdir()
    ours = journal_file(memo_dir, "fedcba9876543210")
    ours.write_text(json.dumps(RECORD) + "\n")
    planted = {
        "notes.jsonl": "user notes\n",
        "abc.jsonl": json.dumps(RECORD) + "\n",  # a record, but not a name ctxprec gives
        "FEDCBA9876543210.jsonl": json.dumps(RECORD) + "\n",
    }
    for name, text in planted.items():
        (folder / name).write_text(text)
    (folder / "0123456789abcdef.jsonl").symlink_to(logs / "requests.jsonl")
    os.mkfifo(journal_new(memo_dir, "0123456789abcdee"))
    before_logs = _snapshot(logs)
    memo = Memo(memo_dir)
    try:
        done = replay_journals(memo_dir, memo)
    finally:
        memo.close()
    assert (done.replayed, done.skipped) == (1, 0)
    assert not ours.exists()
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted([*planted, "0123456789abcdef.jsonl", ".new-0123456789abcdee"])
    assert _snapshot(logs) == before_logs


def test_a_journal_swapped_for_a_link_after_the_check_is_not_followed(
    tmp_path: Path, logs: Path
) -> None:
    """The journal folder is opened once and used through that handle: a link put in its place
    while the run is going leads nowhere (its own journal is removed from the folder it made)."""
    memo_dir = _memo(tmp_path)
    journal = open_journal(memo_dir)
    assert journal is not None
    journal.append([RECORD[0]], [(True, "a reason", 3, 1)])
    journal_dir(memo_dir).rename(tmp_path / "moved-journal")
    journal_dir(memo_dir).symlink_to(logs)
    before_logs = _snapshot(logs)
    journal.close(done=True)
    assert _snapshot(logs) == before_logs
    assert list((tmp_path / "moved-journal").iterdir()) == []
    with pytest.raises(OutputError, match="journal is a symbolic link"):
        replay_journals(memo_dir, Memo(memo_dir))


def test_cache_clear_removes_no_value_file_behind_a_link(tmp_path: Path) -> None:
    memo_dir = _memo(tmp_path)
    outside = tmp_path / "outside" / "cd"
    outside.mkdir(parents=True)
    name = "0" * 28 + ".val"
    (outside / name).write_bytes(b"not ctxprec's")
    (memo_dir / "ab").symlink_to(outside.parent)
    inside = memo_dir / "ef" / "0a"
    inside.mkdir(parents=True)
    (inside / name).write_bytes(b"diskcache's")
    with sqlite3.connect(memo_dir / "cache.db") as con:
        for key, filename in (("k1", f"ab/cd/{name}"), ("k2", f"ef/0a/{name}")):
            con.execute(
                "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
                " tag, size, mode, filename, value) VALUES (?, 1, 0, NULL, 0, 0, NULL, 0, 2, ?,"
                " NULL)",
                (key, filename),
            )
    assert main(["cache", "clear", "--cache-dir", str(memo_dir), "--yes"]) == 0
    assert (outside / name).read_bytes() == b"not ctxprec's"
    assert not (memo_dir / "ef").exists()  # its own value file and folders went
    assert (memo_dir / "ab").is_symlink()
