"""Shared test fixtures: an isolated memo folder, the labelled HotpotQA-shaped log, the loopback
fake judge server (on a thread, or in its own process), a loopback S3 server and a bucket in it.
Plain constants and helpers live in `tests/fakes/` (`inputs.py`, `runs.py`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pyarrow.parquet as pq
import pytest

from ctxprec.connectors.judges.retry import RetryClock
from tests.fakes.clock import instant_retries
from tests.fakes.inputs import KEY, REPO, real_hotpot
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread
from tests.fakes.labelled import labelled_log
from tests.fakes.recorder import recording_host
from tests.fakes.runs import judge_process
from tests.fakes.s3_server import S3Server, running_s3_server

# The user's real ctxprec cache folder, as this process found it before the session moved HOME
_REAL_CACHE = os.path.abspath(platformdirs.user_cache_dir("ctxprec"))
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="ctxprec-tests-home-"))
_BEFORE = pytest.StashKey[set[str] | None]()
_TOUCHED: list[str] = []  # what this process opened, listed or changed in _REAL_CACHE
# the audit events that name a path first: opening, connecting, listing, changing
_PATH_EVENTS = frozenset(
    {"open", "sqlite3.connect", "os.listdir", "os.scandir", "os.mkdir", "os.remove",
     "os.rmdir", "os.rename", "os.replace", "os.truncate", "os.utime", "os.chmod",
     "shutil.rmtree", "shutil.copyfile", "shutil.move"}
)  # fmt: skip


def _watch_real_cache(event: str, args: tuple[object, ...]) -> None:
    """An audit hook: note any path under the user's real cache this process reaches for."""
    if event not in _PATH_EVENTS or not args or not isinstance(args[0], str | bytes | os.PathLike):
        return
    try:
        path = os.path.abspath(os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    if path == _REAL_CACHE or path.startswith(_REAL_CACHE + os.sep):
        _TOUCHED.append(f"{event} {path}")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test (and any process a test starts, which inherits this environment): HOME,
    the XDG folders and the memo folder point into a temp folder, so a ctxprec run that loses
    its CTXPREC_CACHE_DIR (a subprocess given a trimmed environment, a Dask worker started
    before a test set it) still reads and writes nothing but a temp folder. And this process
    watches the user's real cache folder: a test that reaches into it fails."""
    for name, sub in (
        ("HOME", ""),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_STATE_HOME", ".local/state"),
        ("CTXPREC_CACHE_DIR", "session-memo"),
    ):
        os.environ[name] = str(_SESSION_HOME / sub) if sub else str(_SESSION_HOME)
    # MLflow's client and server send usage telemetry to the internet unless told not to: tests
    # reach nothing beyond loopback (and its session variable, set and unset by MLflow as runs
    # start and end, broke a later test's request once another test's environment was undone)
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ["DO_NOT_TRACK"] = "true"
    sys.addaudithook(_watch_real_cache)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def _untracked() -> set[str] | None:
    """The checkout's files git neither tracks nor ignores (None outside a git checkout)."""
    try:
        found = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "--others", "--exclude-standard", "-z"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return set(found.stdout.decode(errors="replace").split("\0")) - {""}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _untracked()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test writes into temp folders only: files that appeared in the checkout during the
    session (an MLflow store's ./mlruns, a report written beside the sample) fail it."""
    before = session.config.stash.get(_BEFORE, None)
    after = _untracked()
    if before is None or after is None or not (new := sorted(after - before)):
        return
    shown = ", ".join(new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else "")
    sys.stderr.write(f"\nthe test session wrote into the checkout {REPO}: {shown}\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each test gets its own memo folder, and fails if it reached into the user's real
    ctxprec cache folder (a test reads and writes temp folders only)."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path_factory.mktemp("memo")))
    del _TOUCHED[:]
    yield
    touched, _TOUCHED[:] = sorted(set(_TOUCHED)), []
    if touched:
        pytest.fail(f"the test reached into the user's real cache {_REAL_CACHE}: {touched}")


@pytest.fixture(scope="session")
def hotpot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A labelled retrieval log in HotpotQA's shape (500 rows: id, question, ground_truth,
    contexts, labels, source): the file CTXPREC_TEST_HOTPOT names, else the one
    tests/fakes/labelled.py generates, written once a session. Tests only read it."""
    real = real_hotpot()
    if real is not None:
        return real
    path = tmp_path_factory.mktemp("labelled") / "labelled_500.parquet"
    pq.write_table(labelled_log(), path)
    return path


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJudgeServer]:
    """The fake judge server (default behaviour) on a thread; the OpenAI and Anthropic base URLs
    point at it and both API keys are `KEY`."""
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        for provider in ("OPENAI", "ANTHROPIC"):
            monkeypatch.setenv(f"{provider}_BASE_URL", server.url)
            monkeypatch.setenv(f"{provider}_API_KEY", KEY)
        yield server


@pytest.fixture
def server() -> Iterator[str]:
    """The fake judge in its own process (30 ± 10 ms a call): its …/v1 URL."""
    with judge_process("--latency-ms", "30", "--jitter-ms", "10") as url:
        yield url


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """A loopback S3 server (moto's server mode), one per test module."""
    pytest.importorskip("moto")
    with running_s3_server() as server:
        yield server


_BUCKETS = iter(range(1_000_000))


@pytest.fixture
def bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the process environment points at the loopback server."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    name = f"bucket-{next(_BUCKETS)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def retry_clock() -> RetryClock:
    """Instant, recorded retry waits (jitter draws 0 so waits are exact), for a test to pass to
    the judge or batch client it builds (`create_judge(..., seams=Seams(clock=retry_clock))`)."""
    return instant_retries()


@pytest.fixture
def judge_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both providers' API keys set to KEY; their base-URL variables unset."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, KEY)
    for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def planted_host() -> Iterator[tuple[str, list[str]]]:
    """A loopback host a planted state file names: (its /v1 URL, the requests it received)."""
    with recording_host() as host:
        yield host
