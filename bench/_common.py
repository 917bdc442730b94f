"""Shared helpers of the benchmarks: synthetic Parquet inputs, the fake judge server as a separate
process, per-process CPU/RSS measurement of subprocesses (os.wait4), and result files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PYTHON = sys.executable
CTXPREC = str(Path(PYTHON).with_name("ctxprec"))
SUFFIX_WIDTH = 13  # " #RRRRRRRR.PP": makes every generated item unique

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@functools.cache
def labelled_data() -> Path:
    """The labelled HotpotQA-shaped log a benchmark reads: the file CTXPREC_TEST_HOTPOT names (the
    figures in docs/ were taken on HotpotQA's 500-question sample, which is not in the
    repository), else the log the tests generate (tests/fakes/labelled.py), written to a temp
    folder: the same shape and size, so other figures."""
    import pyarrow.parquet as pq

    from tests.fakes.inputs import real_hotpot
    from tests.fakes.labelled import labelled_log

    real = real_hotpot()
    if real is not None:
        return real
    path = Path(tempfile.mkdtemp(prefix="ctxprec-bench-")) / "labelled_500.parquet"
    pq.write_table(labelled_log(), path)
    return path


# -------------------------------------------------------------------------- subprocesses


@dataclass(frozen=True, slots=True)
class Measured:
    """One finished subprocess: exit code, wall seconds, CPU seconds, peak RSS (MiB), output."""

    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_mib: float
    stdout: str
    stderr: str

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


# A child's ru_maxrss starts at its parent's RSS when it is forked (Linux keeps the high-water mark
# across exec), so a benchmark holding a big dataset would inflate every child's peak. Children
# are therefore forked by this small launcher (a fresh `python -S`, ~10 MiB): it reports the
# child's own rusage from wait4, writes the child's pid for RSS sampling, and forwards SIGINT and
# SIGTERM to it. It runs in its own session, so a SIGKILL to the group ends both.
_LAUNCHER = """
import json, os, signal, sys
out, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
with open(out + ".pid", "w") as f:
    f.write(str(pid))
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda s, _f: os.kill(pid, s))
_, status, ru = os.wait4(pid, 0)
with open(out, "w") as f:
    json.dump({"code": os.waitstatus_to_exitcode(status), "user": ru.ru_utime,
               "sys": ru.ru_stime, "maxrss_kib": ru.ru_maxrss}, f)
"""


def _reap(proc: subprocess.Popen[str], started: float) -> tuple[int, float, Any]:
    """Wait for exactly this child with os.wait4: its own rusage, not all children's."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage


def run_measured(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    interrupt_after_s: float | None = None,
    on_poll: Callable[[int], None] | None = None,
) -> Measured:
    """Run `cmd`; its wall time, user+sys CPU and peak RSS (wait4 of that very process, forked
    by a small launcher so that the benchmark's own memory does not leak into the peak).

    `interrupt_after_s`: send SIGINT after that many seconds (a run cut short on purpose);
    `timeout_s`: SIGKILL after that many. `on_poll(pid)` is called with the command's pid about
    20 times a second while it runs. Output goes to temp files (no pipe can fill up)."""
    with (
        tempfile.TemporaryDirectory(prefix="ctxprec-run-") as tmp,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        report = Path(tmp) / "rusage.json"
        launcher = [PYTHON, "-S", "-c", _LAUNCHER, str(report), *cmd]
        started = time.perf_counter()
        proc = subprocess.Popen(
            launcher, stdout=out, stderr=err, text=True, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            limit = interrupt_after_s if interrupt_after_s is not None else timeout_s
            poll = None if on_poll is None else _child_poll(report, on_poll)
            _wait_until(proc, started + (math.inf if limit is None else limit), poll)
            if not _exited(proc.pid):
                if interrupt_after_s is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.send_signal(signal.SIGINT)  # forwarded to the command
            _, wall, _ = _reap(proc, started)
        except BaseException:
            _kill(proc)
            raise
        usage = json.loads(report.read_text()) if report.is_file() else {}
        out.seek(0)
        err.seek(0)
        return Measured(
            int(usage.get("code", -9)),
            wall,
            float(usage.get("user", 0.0)),
            float(usage.get("sys", 0.0)),
            float(usage.get("maxrss_kib", 0)) / 1024,
            out.read(),
            err.read(),
        )


def _child_poll(report: Path, on_poll: Callable[[int], None]) -> Callable[[int], None]:
    """Call `on_poll` with the command's pid (not the launcher's) once the launcher wrote it."""
    pid_file = report.with_name(report.name + ".pid")

    def poll(_launcher_pid: int) -> None:
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            return
        on_poll(pid)

    return poll


def _exited(pid: int) -> bool:
    """Has the child exited? Peeks without reaping (the rusage must come from wait4 later)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_until(
    proc: subprocess.Popen[str], deadline: float, on_poll: Callable[[int], None] | None = None
) -> None:
    while time.perf_counter() < deadline and not _exited(proc.pid):
        if on_poll is not None:
            on_poll(proc.pid)
        time.sleep(0.05)


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill the launcher and the command (its own process group) and reap the launcher."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, 0)


def check_ok(m: Measured, what: str, allowed: Sequence[int] = (0,)) -> None:
    """Stop the benchmark with the child's stderr when it failed."""
    if m.returncode not in allowed:
        tail = "\n".join((m.stderr or m.stdout).strip().splitlines()[-15:])
        raise SystemExit(f"{what} exited with {m.returncode}:\n{tail}")


def ctxprec_cmd(input_path: Path, outdir: Path, *extra: str) -> list[str]:
    """`ctxprec score INPUT -o OUTDIR --progress off --quiet EXTRA...`."""
    return [
        CTXPREC,
        "score",
        str(input_path),
        "-o",
        str(outdir),
        "--progress",
        "off",
        "--quiet",
        *extra,
    ]


def quiet_line(m: Measured) -> dict[str, Any]:
    """The JSON line `ctxprec score --quiet` prints last."""
    for line in reversed(m.stdout.strip().splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    return {}


_COMPILED: list[bool] = []


def _compile_checkout() -> None:
    """Byte-compile this checkout's packages once per benchmark process, as `pip install`
    does for a user: a child then loads cached bytecode instead of compiling ~100 modules
    (0.2-0.3 s of CPU) on every start, even when the environment sets PYTHONDONTWRITEBYTECODE."""
    if _COMPILED:
        return
    _COMPILED.append(True)
    targets = [str(ROOT / d) for d in ("pipeline", "connectors", "storage", "tests")]
    subprocess.run(
        [PYTHON, "-m", "compileall", "-q", *targets],
        check=False,
        stdout=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    )


def child_env(**extra: str) -> dict[str, str]:
    """The environment for ctxprec children: no proxies, no inherited CTXPREC_* settings,
    bytecode written and read as an installed package's is (`_compile_checkout`)."""
    _compile_checkout()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPREC_", "OPENAI_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    # the code of this checkout, whichever checkout the venv's `ctxprec` was installed from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


# -------------------------------------------------------------------------- fake judge server


@dataclass
class FakeServer:
    """A `tests.fakes.judge_server` process: base URL (…/v1), root URL, and its Popen."""

    proc: subprocess.Popen[str]
    url: str
    started: float

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.root}/_fake/stats", timeout=30) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    def stop(self) -> Measured:
        """SIGTERM, then wait4: the server's own CPU and peak RSS."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            code, wall, usage = _reap_with_timeout(self.proc, self.started, 10.0)
        except ChildProcessError:
            return Measured(0, 0.0, 0.0, 0.0, 0.0, "", "")
        return Measured(code, wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss / 1024, "", "")


def _reap_with_timeout(
    proc: subprocess.Popen[str], started: float, timeout_s: float
) -> tuple[int, float, Any]:
    _wait_until(proc, time.perf_counter() + timeout_s)
    if not _exited(proc.pid):
        proc.kill()
    return _reap(proc, started)


@contextlib.contextmanager
def fake_server(*args: str) -> Iterator[FakeServer]:
    """Start `python -m tests.fakes.judge_server --port 0 ARGS` and always stop it."""
    cmd = [PYTHON, "-m", "tests.fakes.judge_server", "--port", "0", *args]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )
    server: FakeServer | None = None
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise SystemExit(f"fake judge server did not start (got {url!r})")
        server = FakeServer(proc, url, started)
        yield server
    finally:
        if server is not None and proc.returncode is None:
            server.stop()
        _kill(proc)


# -------------------------------------------------------------------------- synthetic inputs


def _base_rows(items_per_row: int) -> list[tuple[str, str, list[str]]]:
    """HotpotQA rows that have exactly `items_per_row` contexts: (query, expected, items)."""
    import polars as pl

    df = pl.read_parquet(labelled_data(), columns=["question", "ground_truth", "contexts"])
    df = df.filter(pl.col("contexts").list.len() >= items_per_row)
    return [
        (q, e, list(c)[:items_per_row])
        for q, e, c in zip(df["question"], df["ground_truth"], df["contexts"], strict=True)
    ]


def _fit(text: str, chars: int | None) -> str:
    if chars is None:
        return text
    body = chars - SUFFIX_WIDTH
    while len(text) < body:
        text = f"{text} {text}"
    return text[:body]


def make_dataset(
    path: Path,
    rows: int,
    *,
    items_per_row: int = 10,
    item_chars: int | None = None,
    chunk_rows: int = 50_000,
) -> Path:
    """Write `rows` rows tiled from HotpotQA: new ids, each item unique (suffix " #row.pos").

    `item_chars` None keeps the HotpotQA texts (~560 chars on average); a number makes every
    item exactly that long. Columns: id, query, expected_output, contexts (ctxprec defaults).
    Written in chunks, so memory stays bounded even for millions of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = [
        (q, e, [_fit(t, item_chars) for t in items]) for q, e, items in _base_rows(items_per_row)
    ]
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("query", pa.string()),
            ("expected_output", pa.string()),
            ("contexts", pa.list_(pa.string())),
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk_rows):
            stop = min(rows, start + chunk_rows)
            writer.write_table(_chunk(base, start, stop, schema), row_group_size=chunk_rows)
    return path


def _chunk(base: list[tuple[str, str, list[str]]], start: int, stop: int, schema: Any) -> Any:
    import pyarrow as pa

    ids, queries, expected, contexts = [], [], [], []
    n = len(base)
    for r in range(start, stop):
        q, e, items = base[r % n]
        ids.append(f"b{r:08d}")
        queries.append(q)
        expected.append(e)
        contexts.append([f"{t} #{r:08d}.{p:02d}" for p, t in enumerate(items)])
    return pa.table([ids, queries, expected, contexts], schema=schema)


def dataset_items(path: Path) -> int:
    """Total context items in a generated file."""
    import polars as pl

    return int(pl.scan_parquet(path).select(pl.col("contexts").list.len().sum()).collect().item())


# -------------------------------------------------------------------------- machine load


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(seconds: float = 1.0) -> float:
    """How many cores were busy over `seconds` (all processes: call it while idle yourself)."""
    b0, t0 = _cpu_times()
    time.sleep(seconds)
    b1, t1 = _cpu_times()
    cores = os.cpu_count() or 1
    return (b1 - b0) / (t1 - t0) * cores if t1 > t0 else 0.0


def _own_cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped so far."""
    usages = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return sum(u.ru_utime + u.ru_stime for u in usages)


class CpuAudit:
    """Did anything else use the CPUs while a benchmark ran? Busy cores before the start, and
    the average cores used by other processes during the run: all CPU time on the machine
    (/proc/stat) minus this process's and its reaped children's (call `others` after the
    children are reaped)."""

    def __init__(self) -> None:
        self.busy_at_start = busy_cores()
        self._busy0, _ = _cpu_times()
        self._own0 = _own_cpu_s()
        self._t0 = time.monotonic()

    def others(self) -> float:
        busy1, _ = _cpu_times()
        machine_s = (busy1 - self._busy0) / os.sysconf("SC_CLK_TCK")
        own_s = _own_cpu_s() - self._own0
        return max(0.0, machine_s - own_s) / max(time.monotonic() - self._t0, 1e-9)

    def as_dict(self) -> dict[str, float]:
        return {"busy_cores_at_start": self.busy_at_start, "other_cores_during": self.others()}


def load_line(audit: CpuAudit) -> str:
    """A line for the figures block: how busy other processes kept the machine."""
    during = audit.others()
    noisy = audit.busy_at_start > 0.3 or during > 0.3
    warn = "  <- NOT an idle machine: timing figures are suspect" if noisy else ""
    return (
        f"machine: {os.cpu_count()} CPUs; other processes used {audit.busy_at_start:.2f} cores "
        f"at start, {during:.2f} on average during the run{warn}"
    )


def wait_for_idle(max_busy: float = 0.3, timeout_s: float = 300.0) -> float:
    """Wait (up to `timeout_s`) until other processes use under `max_busy` cores; returns the
    last reading. Timing figures taken while something else runs on this box are not worth much."""
    deadline = time.monotonic() + timeout_s
    busy = busy_cores()
    while busy > max_busy and time.monotonic() < deadline:
        busy = busy_cores(2.0)
    return busy


# -------------------------------------------------------------------------- results


def write_result(name: str, result: dict[str, Any]) -> Path:
    """bench/results/<name>.json (git-ignored); also <dir>/<name>.json when the environment
    variable BENCH_RESULTS_DIR names a directory (run_all.py's private copy: another session
    running the same benchmark at the same time cannot overwrite what its table reads)."""
    payload = {
        "benchmark": name,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_at_end": os.getloadavg(),
    } | result
    text = json.dumps(payload, indent=2, default=_jsonable) + "\n"
    extra = os.environ.get("BENCH_RESULTS_DIR")
    for folder in (RESULTS, *([Path(extra)] if extra else [])):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(text, encoding="utf-8")
    return RESULTS / f"{name}.json"


def _jsonable(value: object) -> object:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_block(title: str, lines: Sequence[str]) -> None:
    """A clear block of figures on stdout."""
    bar = "=" * max(len(title), 60)
    print(f"\n{bar}\n{title}\n{bar}")
    for line in lines:
        print(line)
    sys.stdout.flush()


@contextlib.contextmanager
def workdir(keep: Path | None = None) -> Iterator[Path]:
    """A temp directory for inputs and outputs (or `keep` when given, left in place)."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="ctxprec-bench-") as tmp:
        yield Path(tmp)
