"""One writer per output folder: a run holds OUTDIR/_ctxprec/lock for its whole life. The file
names its holder (host, pid, start time, command) and is touched every few seconds while the run
lives; a lock of a dead process on this host, or one not touched for minutes, is taken over.

In an object store there is no O_EXCL and no rename: the lock is a lease object. A run writes it
only when no lease is there, waits `SETTLE_S`, reads it back and holds the lock only if its own
token is still the one written (of two runs that raced, the later PUT wins and the other backs
off). The holder rewrites the lease every `REFRESH_S`; one not rewritten for `STALE_S` is taken
over. Limits: a run whose check and PUT are more than `SETTLE_S` apart (a stalled client) can
still overlap another, and staleness is judged by the store's clock against ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.redact import without_url_secrets
from ctxprec.storage.core.seams import DEFAULT
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import TMP_PREFIX, write_error
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "REFRESH_S",
    "STALE_S",
    "Holder",
    "LockFile",
    "OutdirLock",
    "command_line",
    "damaged_lock",
    "live_holder",
    "read_holder",
]

REFRESH_S = 10.0  # the holder touches the lock this often
STALE_S = 120.0  # a lock nobody touched for this long belongs to a run that is gone
POLL_S = 0.5
SETTLE_S = DEFAULT.lock_settle_s  # object stores: how long a new lease must stay ours


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as written in the lock file."""

    host: str
    pid: int
    started_at: str
    command: str
    token: str

    def describe(self) -> str:
        return (
            f"pid {self.pid} on {printable(self.host)}, since {printable(self.started_at)}, "
            f"running `{printable(self.command)}`"
        )


class LockFile(NamedTuple):
    """What a lock file says: its holder (None while it is being created, or when it is
    damaged), seconds since it was last touched, and why it is not a lock (None: it is one)."""

    holder: Holder | None
    age: float
    damage: str | None = None

    def describe(self, path: OutPath, *, age: bool = True) -> str:
        """Who holds the lock, in words (a damaged lock file is named with what is wrong)."""
        if self.damage is not None:
            touched = f", touched {self.age:.0f} s ago" if age else ""
            return f"a damaged lock file {path} ({self.damage}){touched}"
        return self.holder.describe() if self.holder else "a run that is starting"


def command_line() -> str:
    """This process's command line, fit for a file (no credentials of a URL)."""
    text = " ".join(shlex.quote(a) for a in sys.argv) or "python"
    return without_url_secrets(text)[:500]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process whose parent has not reaped it yet is a zombie: not running
        line = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    return line.rpartition(")")[2].split()[:1] != ["Z"]


_MAX_LOCK_BYTES = 64 << 10  # a lock ctxprec writes is a few hundred bytes
# what a holder's fields may be: the lock is data anyone who can write OUTDIR may have written
_FIELDS: dict[str, tuple[type, int]] = {
    "host": (str, 255), "pid": (int, 2**31 - 1), "started_at": (str, 64),
    "command": (str, 1000), "token": (str, 64),
}  # fmt: skip


def read_holder(path: OutPath) -> LockFile | None:
    """What the lock file `path` says; None when there is none. An empty file is a lock being
    created (no holder, no damage). A file that is not one of ctxprec's locks (not a regular
    file, too large, not UTF-8 JSON of a holder's fields) is read as damaged: its age still
    counts (a live run keeps touching its lock, whatever its bytes), never its contents. Read
    through no link and never more than 64 KiB."""
    if isinstance(path, ObjPath):
        try:
            age = time.time() - path.stat().st_mtime
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return LockFile(None, 0.0)
        return _parse_lock(data, age)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return LockFile(None, 0.0)  # unreadable right now (permissions): as being created
        try:
            age = time.time() - os.lstat(path).st_mtime
        except FileNotFoundError:
            return None
        return LockFile(None, age, "a symbolic link")
    try:
        info = os.fstat(fd)
        age = time.time() - info.st_mtime
        if not stat.S_ISREG(info.st_mode):
            return LockFile(None, age, "not a regular file")
        data = _read_capped(fd)
    except OSError:
        return LockFile(None, 0.0)
    finally:
        os.close(fd)
    return _parse_lock(data, age)


def _read_capped(fd: int) -> bytes:
    chunks, size = [], 0
    while size <= _MAX_LOCK_BYTES and (chunk := os.read(fd, _MAX_LOCK_BYTES + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _parse_lock(data: bytes, age: float) -> LockFile:
    if not data:
        return LockFile(None, age)  # created, not written yet
    if len(data) > _MAX_LOCK_BYTES:
        return LockFile(None, age, f"larger than {_MAX_LOCK_BYTES >> 10} KiB")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return LockFile(None, age, "not UTF-8 text")
    except (ValueError, RecursionError):
        return LockFile(None, age, "not JSON")
    problem = _holder_problem(raw)
    if problem is not None:
        return LockFile(None, age, problem)
    return LockFile(Holder(**{k: raw[k] for k in _FIELDS}), age)


def _holder_problem(raw: object) -> str | None:
    if not isinstance(raw, dict):
        return "not a JSON object"
    for name, (kind, limit) in _FIELDS.items():
        value = raw.get(name)
        if kind is int:
            ok = type(value) is int and 0 < value <= limit
        else:
            ok = isinstance(value, str) and 0 < len(value) <= limit
        if not ok:
            return f"its {name} is not a holder's {name}"
    return None


def live_holder(outdir: OutPath, stale_s: float = STALE_S) -> Holder | None:
    """Who is writing `outdir` now; None when no live run holds its lock."""
    found = read_holder(layout.lock(outdir))
    if found is None or found.holder is None or found.age > stale_s:
        return None
    holder = found.holder
    if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
        return None
    return holder


def damaged_lock(outdir: OutPath, stale_s: float = STALE_S) -> str | None:
    """Why the lock of `outdir` cannot be read as one while it is fresh (a run may be touching
    it), in words naming the file; None when it is a lock, absent, or stale (nobody holds it)."""
    path = layout.lock(outdir)
    found = read_holder(path)
    if found is None or found.damage is None or found.age > stale_s:
        return None
    return found.describe(path)


class OutdirLock:
    """The lock of one output folder. A copy sent to another process holds nothing."""

    def __init__(
        self,
        outdir: OutPath,
        *,
        refresh_s: float = REFRESH_S,
        stale_s: float = STALE_S,
        settle_s: float = SETTLE_S,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.outdir = outdir
        self.path = layout.lock(outdir)
        self.refresh_s = refresh_s
        self.stale_s = stale_s
        self.settle_s = settle_s
        self._log = log or (lambda line: print(line, file=sys.stderr))
        self.holder = Holder(
            socket.gethostname(),
            os.getpid(),
            datetime.now(UTC).isoformat(timespec="seconds"),
            command_line(),
            uuid.uuid4().hex,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"outdir": self.outdir, "refresh_s": self.refresh_s, "stale_s": self.stale_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        OutdirLock.__init__(
            self, state["outdir"], refresh_s=state["refresh_s"], stale_s=state["stale_s"]
        )

    @property
    def held(self) -> bool:
        return self._thread is not None

    # -- taking and giving back ------------------------------------------------------------
    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_s` seconds for its holder to finish."""
        deadline = time.monotonic() + max(0.0, wait_s)
        announced = False
        while True:
            if self._create():
                self._start_refreshing()
                return
            found = read_holder(self.path)
            if found is None:
                continue  # released meanwhile: try again at once
            if found.damage is not None and not confine.is_regular(self.path):
                raise self._not_a_file(found)
            reason = self._stale(found.holder, found.age)
            if reason is not None:
                self._take_over(found, reason)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._busy(found, waited=wait_s > 0)
            if not announced:
                who = found.describe(self.path)
                self._log(f"ctxprec: {self.outdir} is locked by {who}; waiting up to {wait_s:g} s")
                announced = True
            time.sleep(min(POLL_S, left))

    def release(self) -> None:
        """Give the lock back (only if the file is still this run's)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        found = read_holder(self.path)
        if found is not None and found.holder is not None and found.holder == self.holder:
            with contextlib.suppress(OSError):
                self.path.unlink()

    # -- internals -------------------------------------------------------------------------
    def _create(self) -> bool:
        """Create the lock file atomically (O_EXCL): of two runs, exactly one succeeds."""
        body = json.dumps(self.holder.__dict__, indent=2).encode()
        if isinstance(self.path, ObjPath):
            return self._create_lease(self.path, body)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise write_error(self.path, exc) from exc
        try:
            os.write(fd, body)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise write_error(self.path, exc) from exc
        os.close(fd)
        return True

    def _create_lease(self, path: ObjPath, body: bytes) -> bool:
        """Object stores: PUT the lease when none is there, then keep it only if it is still
        ours after `settle_s` (see the module text for the limits)."""
        try:
            if path.exists():
                return False
            path.write_bytes(body)
        except OSError as exc:
            raise write_error(path, exc) from exc
        time.sleep(self.settle_s)
        found = read_holder(path)
        return found is not None and found.holder == self.holder

    def _stale(self, holder: Holder | None, age: float) -> str | None:
        if age > self.stale_s:
            return f"not refreshed for {age:.0f} s"
        if (
            holder is not None
            and holder.host == self.holder.host
            and holder.pid != os.getpid()
            and not _pid_alive(holder.pid)
        ):
            return f"process {holder.pid} is no longer running"
        return None

    def _take_over(self, found: LockFile, reason: str) -> None:
        """Move the stale lock aside (one process wins the rename), then create ours."""
        empty = found.holder is None and found.damage is None
        who = "an empty lock" if empty else found.describe(self.path, age=False)
        if isinstance(self.path, ObjPath):
            again = read_holder(self.path)
            if again is not None and again.holder == found.holder:  # still the stale one
                self._log(f"ctxprec: taking over the lock on {self.outdir} from {who} ({reason})")
                with contextlib.suppress(OSError):
                    self.path.unlink(missing_ok=True)
            return
        aside = self.path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{self.path.name}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another process took it over first
        moved = read_holder(aside)
        if moved is not None and moved.holder != found.holder:
            # a fresh lock was created (or finished) in between: put it back untouched
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
        else:
            self._log(f"ctxprec: taking over the lock on {self.outdir} from {who} ({reason})")
        aside.unlink(missing_ok=True)

    def _not_a_file(self, found: LockFile) -> OutputError:
        return OutputError(
            f"{self.path} is {found.damage}, not a lock file ctxprec wrote; nothing was changed: "
            "remove it (no run of ctxprec makes one) and run the same command again"
        )

    def _busy(self, found: LockFile, *, waited: bool) -> OutputError:
        if found.damage is not None:
            return OutputError(
                f"output folder {self.outdir} is locked by {found.describe(self.path)}: a run "
                f"may still be touching it, so it is taken over only once nobody has touched it "
                f"for {self.stale_s:.0f} s; nothing was changed: remove it if no run is writing "
                "this folder, or pass --wait-lock SECONDS to wait until it is stale"
            )
        who = found.describe(self.path) if found.holder else "another run that is starting"
        hint = (
            "it is still running: try again later or wait longer with --wait-lock SECONDS"
            if waited
            else "wait for it to finish, or pass --wait-lock [SECONDS] to wait for it"
        )
        return OutputError(f"output folder {self.outdir} is being written by {who}; {hint}")

    def _start_refreshing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._refresh, name="ctxprec-lock", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh_s):
            with contextlib.suppress(OSError):
                if isinstance(self.path, ObjPath):  # no utime: rewrite the lease if still ours
                    found = read_holder(self.path)
                    if found is not None and found.holder == self.holder:
                        self.path.write_bytes(json.dumps(self.holder.__dict__, indent=2).encode())
                else:
                    os.utime(self.path)
