"""The output folder's lock: one holder at a time (atomic creation), who holds it and since when,
refreshed while held, taken over from a dead process or when stale, waited for on request."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.outdir.lock import OutdirLock, live_holder, read_holder

T = TypeVar("T")


def make(outdir: Path, log: list[str] | None = None, **kw: float) -> OutdirLock:
    return OutdirLock(outdir, log=(log.append if log is not None else None), **kw)


def test_the_lock_file_names_its_holder(tmp_path: Path) -> None:
    lock = make(tmp_path)
    lock.acquire()
    try:
        raw = json.loads((tmp_path / "_ctxprec" / "lock").read_text(encoding="utf-8"))
        assert raw["host"] == socket.gethostname()
        assert raw["pid"] == os.getpid()
        assert raw["started_at"]
        assert raw["command"]
        assert live_holder(tmp_path) == lock.holder
    finally:
        lock.release()
    assert not (tmp_path / "_ctxprec" / "lock").exists()
    assert live_holder(tmp_path) is None


def test_a_second_holder_is_refused_with_who_and_since(tmp_path: Path) -> None:
    first = make(tmp_path)
    first.acquire()
    try:
        with pytest.raises(OutputError) as info:
            make(tmp_path).acquire()
        text = str(info.value)
        assert f"output folder {tmp_path} is being written by pid {os.getpid()}" in text
        assert f"since {first.holder.started_at}" in text
        assert "--wait-lock" in text
    finally:
        first.release()


def test_only_one_of_many_simultaneous_starts_wins(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    won: list[OutdirLock] = []
    lost: list[Exception] = []

    def start() -> None:
        lock = make(tmp_path)
        barrier.wait()
        try:
            lock.acquire()
            won.append(lock)
        except OutputError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert len(lost) == 7
    won[0].release()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(outdir: Path, *, pid: int, host: str, age_s: float = 0.0) -> Path:
    path = outdir / "_ctxprec" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"host": host, "pid": pid, "started_at": "2026-01-01T00:00:00+00:00"}
    path.write_text(json.dumps({**body, "command": "ctxprec score x", "token": "t"}))
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path: Path) -> None:
    dead = _dead_pid()
    _plant(tmp_path, pid=dead, host=socket.gethostname())
    log: list[str] = []
    lock = make(tmp_path, log)
    lock.acquire()
    try:
        assert len(log) == 1
        assert f"process {dead} is no longer running" in log[0]
        assert "taking over the lock" in log[0]
        found = read_holder(tmp_path / "_ctxprec" / "lock")
        assert found is not None
        assert found[0] == lock.holder
    finally:
        lock.release()


def test_a_lock_not_refreshed_for_long_is_taken_over(tmp_path: Path) -> None:
    _plant(tmp_path, pid=1, host="another-host", age_s=600)
    log: list[str] = []
    lock = make(tmp_path, log)
    lock.acquire()
    lock.release()
    assert len(log) == 1
    assert "not refreshed for 600 s" in log[0]


def test_a_fresh_lock_of_another_host_is_respected(tmp_path: Path) -> None:
    _plant(tmp_path, pid=_dead_pid(), host="another-host")
    with pytest.raises(OutputError, match=r"pid .* on another-host"):
        make(tmp_path).acquire()


def test_the_holder_refreshes_the_lock(tmp_path: Path) -> None:
    lock = make(tmp_path, refresh_s=0.02)
    lock.acquire()
    path = tmp_path / "_ctxprec" / "lock"
    old = time.time() - 100
    os.utime(path, (old, old))
    try:
        for _ in range(500):  # until the refresher touched it (no timing assert)
            if time.time() - path.stat().st_mtime < 50:
                break
            time.sleep(0.01)
        assert time.time() - path.stat().st_mtime < 50
    finally:
        lock.release()


def test_wait_lock_takes_it_once_the_holder_is_done(tmp_path: Path) -> None:
    first = make(tmp_path)
    first.acquire()
    log: list[str] = []
    second = make(tmp_path, log)
    waiter = threading.Thread(target=second.acquire, args=(60.0,))
    waiter.start()
    for _ in range(500):
        if log:
            break
        time.sleep(0.01)
    assert log
    assert "waiting up to 60 s" in log[0]
    first.release()
    waiter.join(30)
    assert second.held
    second.release()


def test_a_copy_sent_to_another_process_holds_nothing(tmp_path: Path) -> None:
    lock = make(tmp_path)
    lock.acquire()
    try:
        copy = pickle.loads(pickle.dumps(lock))
        assert not copy.held
        copy.release()  # a no-op: the driver's lock stays
        assert live_holder(tmp_path) == lock.holder
    finally:
        lock.release()


def test_a_killed_process_not_yet_reaped_counts_as_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(1000):  # exited, but not waited for: a zombie
        if Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            break
        time.sleep(0.01)
    _plant(tmp_path, pid=proc.pid, host=socket.gethostname())
    try:
        assert live_holder(tmp_path) is None
        log: list[str] = []
        lock = make(tmp_path, log)
        lock.acquire()
        lock.release()
        assert f"process {proc.pid} is no longer running" in log[0]
    finally:
        proc.wait()


def _in_time(fn: Callable[[], T]) -> T:
    """`fn()` run in a thread: a read that blocks (a FIFO, /dev/zero) fails the test instead
    of hanging it."""
    got: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            got.append(fn())
        except BaseException as exc:  # re-raised in the test's thread
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    if raised:
        raise raised[0]
    assert got, "reading the lock did not come back"
    return got[0]


def _holder_with(**fields: object) -> bytes:
    body = {"host": "h", "pid": 123, "started_at": "2026", "command": "c", "token": "t"}
    return json.dumps({**body, **fields}).encode()


# lock files ctxprec never writes: each is read as damaged, in bounded time and memory
DAMAGED_FILES = {
    "random bytes": bytes(range(256)) * 4,
    "not JSON": b"lock held by me",
    "a list": b"[]",
    "deep": b"[" * 100_000,
    "pid as text": _holder_with(pid="123"),
    "negative pid": _holder_with(pid=-1),
    "pid zero": _holder_with(pid=0),
    "huge pid": _holder_with(pid=2**80),
    "no token": json.dumps({"host": "h", "pid": 5}).encode(),
    "too large": b" " * (1 << 20),
}
NOT_FILES: dict[str, Callable[[Path], None]] = {
    "fifo": lambda p: os.mkfifo(p),
    "link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "folder": lambda p: p.mkdir(),
}


def _plant_damaged(outdir: Path, kind: str, age_s: float = 0.0) -> Path:
    path = outdir / "_ctxprec" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind in DAMAGED_FILES:
        path.write_bytes(DAMAGED_FILES[kind])
    else:
        NOT_FILES[kind](path)
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old), follow_symlinks=False)
    return path


@pytest.mark.parametrize("kind", [*DAMAGED_FILES, *NOT_FILES])
def test_a_damaged_lock_is_read_as_damaged_never_as_a_holder(tmp_path: Path, kind: str) -> None:
    path = _plant_damaged(tmp_path, kind)
    found = _in_time(lambda: read_holder(path))
    assert found is not None
    assert found.holder is None
    assert found.damage
    assert _in_time(lambda: live_holder(tmp_path)) is None


@pytest.mark.parametrize("kind", list(DAMAGED_FILES))
def test_a_fresh_damaged_lock_is_named_and_respected(tmp_path: Path, kind: str) -> None:
    path = _plant_damaged(tmp_path, kind)
    before = path.read_bytes()
    with pytest.raises(OutputError) as info:
        make(tmp_path).acquire()
    text = str(info.value)
    assert f"damaged lock file {path}" in text
    assert "--wait-lock" in text
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind", list(DAMAGED_FILES))
def test_a_stale_damaged_lock_is_taken_over(tmp_path: Path, kind: str) -> None:
    path = _plant_damaged(tmp_path, kind, age_s=600)
    log: list[str] = []
    lock = make(tmp_path, log)
    lock.acquire()
    try:
        assert len(log) == 1
        assert f"taking over the lock on {tmp_path} from a damaged lock file {path}" in log[0]
        found = read_holder(path)
        assert found is not None
        assert found.holder == lock.holder
    finally:
        lock.release()
    assert not [p for p in path.parent.iterdir() if p.name != "lock"]  # nothing left aside


@pytest.mark.parametrize("kind", list(NOT_FILES))
def test_a_lock_that_is_not_a_file_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    path = _plant_damaged(tmp_path, kind, age_s=600)
    with pytest.raises(OutputError) as info:
        _in_time(lambda: make(tmp_path).acquire())
    assert f"{path} is " in str(info.value)
    assert "nothing was changed" in str(info.value)
    assert os.path.lexists(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["lock"]
