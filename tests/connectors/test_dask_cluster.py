"""A backfill as the docs deploy it: `dask scheduler` and `dask worker` processes started from the
installed wheel (not this checkout), each worker in its own empty folder with its own HOME and
caches, no shared filesystem: input and OUTDIR in a loopback S3 bucket. One worker is SIGKILLed
mid-run and replaced; then the same OUTDIR is extended on fresh workers with empty caches.

The wheel: `CTXPREC_WHEEL_VENV` (CI sets it to a venv with `ctxprec[dask]` installed from the
built wheel), else a wheel built here from the checkout, installed into a temp venv that borrows
this venv's dependencies. Under CI the test never skips.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from ctxprec.storage.core.metric import map_score
from tests.fakes.inputs import KEY, REPO
from tests.fakes.judge_server import expected_verdict
from tests.fakes.runs import fake_stats, judge_process, score
from tests.fakes.s3_server import S3Server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Mismatched versions found"),  # pandas only here
]

RPM = 1200  # the run's limit for the whole cluster (20 a second), and the judge's own: it
WINDOW_S = 10  # enforces it pro rata over every sliding 10 s (a minute's limit, tightened)
QUERIES, POOL, ITEMS, FILES, ROWS = 30, 8, 5, 4, 60


# ---------------------------------------------------------------- the wheel


def _fail_or_skip(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a venv where ctxprec is the installed wheel."""
    given = os.environ.get("CTXPREC_WHEEL_VENV")
    if given:
        return Path(given) / "bin" / "python"
    tmp = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", REPO],
        capture_output=True,
        text=True,
    )
    wheels = list((tmp / "dist").glob("ctxprec-*.whl"))
    if built.returncode != 0 or not wheels:
        _fail_or_skip(f"cannot build the wheel here: {built.stderr[-500:]}")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this venv's dependencies, as a plain path: its own .pth files (the editable ctxprec) are
    # not processed, and the wheel in the venv's site-packages comes first
    Path(site, "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", "--force-reinstall", wheels[0]],  # the borrowed editable one is not it
        check=True,
    )  # fmt: skip
    return python


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """A scheduler and worker processes of the wheel's Python, each in its own folder."""

    def __init__(self, python: Path, root: Path, env: dict[str, str]) -> None:
        self.python, self.root, self.env = python, root, env
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _dask(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        folder = self.root / name
        folder.mkdir()
        env = dict(self.env)
        for var, sub in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("TMPDIR", "tmp")):
            (folder / sub).mkdir()
            env[var] = str(folder / sub)
        env["XDG_DATA_HOME"] = env["XDG_CONFIG_HOME"] = str(folder / "home")
        log = open(folder / "log.txt", "wb")  # noqa: SIM115 - the process writes it until killed
        proc = subprocess.Popen(
            [self.python, "-m", "dask", *args], cwd=folder, env=env, stdout=log, stderr=log
        )
        self.procs[name] = proc
        return proc

    def start_scheduler(self) -> None:
        port = self.address.rsplit(":", 1)[1]
        self._dask("scheduler", "scheduler", "--host", "127.0.0.1", "--port", port,
                   "--no-dashboard")  # fmt: skip

    def start_worker(self, name: str) -> None:
        self._dask(name, "worker", self.address, "--nthreads", "1", "--no-nanny",
                   "--no-dashboard", "--local-directory", "dask", "--name", name)  # fmt: skip

    def worker_folders(self) -> list[Path]:
        return [self.root / n for n in self.procs if n != "scheduler"]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _worker_env(s3: S3Server, python: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= s3.env() | {"OPENAI_API_KEY": KEY, "PYTHONNOUSERSITE": "1"}
    env["PATH"] = f"{python.parent}:{env.get('PATH', '')}"
    return env


@contextlib.contextmanager
def running_cluster(python: Path, root: Path, env: dict[str, str]) -> Iterator[Cluster]:
    cluster = Cluster(python, root, env)
    try:
        cluster.start_scheduler()
        yield cluster
    finally:
        cluster.stop()


def _wait_for_workers(address: str, n: int) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.Client(address, timeout=60) as client:
        client.wait_for_workers(n, timeout=90)


# ---------------------------------------------------------------- the data


def labelled_rows(seed: int) -> pl.DataFrame:
    """Several retrievers per query: each row ranks ITEMS passages from its query's pool, so the
    same (query, passage) pairs recur across rows and files."""
    rng = random.Random(seed)
    rows = []
    for i in range(FILES * ROWS):
        q = rng.randrange(QUERIES)
        pool = [f"passage {q}-{p}: text on topic {q} number {p}" for p in range(POOL)]
        rows.append({"id": f"r{i}", "query": f"query {q}?", "contexts": rng.sample(pool, ITEMS)})
    return pl.DataFrame(rows)


def distinct_pairs(frame: pl.DataFrame) -> int:
    return frame.explode("contexts").select("query", "contexts").n_unique()


def read_output(s3: S3Server, prefix: str) -> pl.DataFrame:
    fs = s3.filesystem()
    found = fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
    parts = [
        pl.from_arrow(pq.read_table(f.path, filesystem=fs))
        for f in found
        if f.path.endswith(".parquet") and "/_ctxprec/" not in f.path
    ]
    return pl.concat([p for p in parts if isinstance(p, pl.DataFrame)], how="diagonal_relaxed")


def check_rows(out: pl.DataFrame, source: pl.DataFrame) -> None:
    assert out.get_column("id").is_unique().all()
    assert sorted(out.get_column("id").to_list()) == sorted(source.get_column("id").to_list())
    joined = out.select("id", "score", "verdicts").join(source, on="id")
    for row in joined.iter_rows(named=True):
        labels = [expected_verdict(item) for item in row["contexts"]]
        assert row["verdicts"] == labels, row["id"]
        assert row["score"] == map_score(labels), row["id"]


# ---------------------------------------------------------------- the test


def test_a_backfill_on_a_cluster_of_wheel_installs(
    wheel_python: Path, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    where = subprocess.run(
        [wheel_python, "-c", "import ctxprec.engines.keyed as m; print(m.__file__)"],
        capture_output=True, text=True, env=_worker_env(s3_server, wheel_python), cwd=tmp_path,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert str(REPO) not in where.stdout  # the workers run the wheel, not this checkout
    source = labelled_rows(seed=3)
    for i in range(FILES):
        local = tmp_path / f"part{i}.parquet"
        source.slice(i * ROWS, ROWS).write_parquet(local)
        s3_server.upload(local, f"{bucket}/in/part{i}.parquet")
    distinct = distinct_pairs(source)
    env = _worker_env(s3_server, wheel_python)
    judge_flags = ("--latency-ms", "40", "--rpm-limit", str(RPM), "--rpm-window-s", str(WINDOW_S))
    with judge_process(*judge_flags) as url, running_cluster(wheel_python, tmp_path, env) as c:
        c.start_worker("w1")
        c.start_worker("w2")
        _wait_for_workers(c.address, 2)
        flags = ["--model", "openai/judge", "--base-url", url, "--rpm", RPM, "--concurrency", 4]
        flags += ["--engine", "dask", "--scheduler", c.address]
        codes: list[int] = []
        src, out = f"s3://{bucket}/in/", f"s3://{bucket}/out/"
        run = threading.Thread(target=lambda: codes.append(score(src, "-o", out, *flags)))
        run.start()
        deadline = time.monotonic() + 90
        while fake_stats(url)["total"] < distinct // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        c.procs["w1"].send_signal(signal.SIGKILL)
        c.procs["w1"].wait()
        in_flight = fake_stats(url)["max_in_flight"]  # an upper bound on those at the kill
        c.start_worker("w3")
        run.join(120)
        assert codes == [0]
        first = fake_stats(url)
        check_rows(read_output(s3_server, f"{bucket}/out"), source)
        # each distinct pair once, but for the killed worker's calls in flight and those it
        # finished in the last half second (SHARD_FLUSH_S) before its verdicts reached OUTDIR
        assert distinct <= first["total"] <= distinct + in_flight + RPM // 60 // 2 + 1
        assert "rpm_429" not in first["by_outcome"]  # one --rpm for the whole cluster
        windows = first["per_second"]
        assert max(windows.values()) <= RPM // 60 + 2

        # the same OUTDIR on fresh hosts with empty caches: more rows of already judged pairs
        for name in ("w2", "w3"):
            c.procs[name].send_signal(signal.SIGKILL)
            c.procs[name].wait()
        c.start_worker("w4")
        c.start_worker("w5")
        _wait_for_workers(c.address, 2)
        more = source.head(ROWS).with_columns(pl.format("x{}", pl.col("id")).alias("id"))
        more.write_parquet(tmp_path / "part9.parquet")
        s3_server.upload(tmp_path / "part9.parquet", f"{bucket}/in/part9.parquet")
        assert score(src, "-o", out, *flags, "--incremental") == 0
        assert fake_stats(url)["total"] == first["total"]  # not one call
    check_rows(read_output(s3_server, f"{bucket}/out"), pl.concat([source, more]))
    for folder in c.worker_folders():  # parts and verdicts went to the bucket only
        assert not list(folder.rglob("*.parquet")), folder
        assert not list(folder.rglob("*.arrow")), folder
