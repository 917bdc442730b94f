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
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.redact import without_url_secrets
from ctxprec.storage.core.seams import DEFAULT
from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import TMP_PREFIX, write_error
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "REFRESH_S",
    "STALE_S",
    "Holder",
    "OutdirLock",
    "command_line",
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
        return f"pid {self.pid} on {self.host}, since {self.started_at}, running `{self.command}`"


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
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def read_holder(path: OutPath) -> tuple[Holder | None, float] | None:
    """(holder, seconds since last touched) of a lock file; None when there is no lock; holder
    None when the file cannot be read as a lock (it is being created)."""
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return None, 0.0
    try:
        raw = json.loads(text)
        return Holder(**{k: raw[k] for k in Holder.__dataclass_fields__}), age
    except (ValueError, KeyError, TypeError):
        return None, age


def live_holder(outdir: OutPath, stale_s: float = STALE_S) -> Holder | None:
    """Who is writing `outdir` now; None when no live run holds its lock."""
    found = read_holder(layout.lock(outdir))
    if found is None or found[0] is None or found[1] > stale_s:
        return None
    holder = found[0]
    if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
        return None
    return holder


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
            holder, age = found
            reason = self._stale(holder, age)
            if reason is not None:
                self._take_over(holder, reason)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._busy(holder, waited=wait_s > 0)
            if not announced:
                who = holder.describe() if holder else "a run that is starting"
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
        if found is not None and found[0] is not None and found[0].token == self.holder.token:
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
        return found is not None and found[0] is not None and found[0] == self.holder

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

    def _take_over(self, holder: Holder | None, reason: str) -> None:
        """Move the stale lock aside (one process wins the rename), then create ours."""
        if isinstance(self.path, ObjPath):
            found = read_holder(self.path)
            if found is not None and found[0] == holder:  # still the stale one: remove it
                who = holder.describe() if holder else "an unreadable lock"
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
        if holder is not None and moved is not None and moved[0] != holder:
            # a fresh lock was created in between: put it back untouched
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
        else:
            who = holder.describe() if holder else "an unreadable lock"
            self._log(f"ctxprec: taking over the lock on {self.outdir} from {who} ({reason})")
        aside.unlink(missing_ok=True)

    def _busy(self, holder: Holder | None, *, waited: bool) -> OutputError:
        who = holder.describe() if holder else "another run that is starting"
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
                    if found is not None and found[0] == self.holder:
                        self.path.write_bytes(json.dumps(self.holder.__dict__, indent=2).encode())
                else:
                    os.utime(self.path)
