"""Every kind of state file ctxprec reads back from OUTDIR (`ctxprec.storage.files.layout`), its
part files, its lock and the entries of its memo folder, damaged in every way we can think of,
then the real CLI run again on the folder: each case ends in exit 2 with a one-line message and
the folder (and the memo folder) unchanged (`_SUCCESS` kept), or in a safe recovery (the run
finishes with every row); never exit 3, never a file changed outside OUTDIR and the memo."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.outdir.batches import BatchStore
from ctxprec.storage.outdir.verdicts import VerdictStore, verdict_dir
from tests.fakes.folders import checksums
from tests.fakes.inputs import write_input
from tests.fakes.runs import score

ROWS = 6
RUN = ["--batch-rows", "2"]  # three parts


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished output of an offline run, with a planted pending record, sink record and
    batch state of the shapes ctxprec writes (copied for each case)."""
    root = tmp_path_factory.mktemp("fuzz")
    source, out = write_input(root / "in.parquet", range(ROWS)), root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXPREC_CACHE_DIR", str(root / "memo"))
        assert score(source, "-o", out, *RUN) == 0
        assert main(["estimate", str(source), "-o", str(out)]) == 0
    store = VerdictStore(verdict_dir(out, str(source)))
    store.append([("v1-x", (True, "a reason", 10, 2))])
    store.flush()
    _plant_journal(root / "memo")
    _plant_lock(out)
    state = out / "_ctxprec"
    key = "00000-00009"
    (state / "parts" / f"{key}.pending").write_text(
        json.dumps({"key": key, "files": [f"part-{key}.parquet"]})
    )
    (state / "sink-0123456789abcdef.json").write_text(
        json.dumps({"sink": "duckdb:x.db", "loaded": {"part-00000-00000.parquet": 0}})
    )
    chunk = "c20260101T000000-00001-r0-0001"
    batches = state / "batches"
    batches.mkdir()
    (batches / "state.json").write_text(json.dumps(_batch_state(chunk)))
    (batches / f"{chunk}.ids").write_text("k0\tabc123 def456\nk1\t0a1b\n")
    return source, out


def _plant_journal(memo: Path) -> None:
    """A journal a killed run left in the memo folder: one verdict record."""
    folder = memo / "journal"
    folder.mkdir(exist_ok=True)
    record = ["v2-" + "0" * 64, True, "a reason", 10, 2]
    (folder / "0123456789abcdef.jsonl").write_text(json.dumps(record) + "\n")


def _plant_lock(out: Path) -> None:
    """The lock of a run that died on this host (taken over by the next run)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    body = {"host": socket.gethostname(), "pid": proc.pid, "started_at": "2026-01-01T00:00:00",
            "command": "ctxprec score in.parquet -o out", "token": "0" * 32}  # fmt: skip
    (out / "_ctxprec" / "lock").write_text(json.dumps(body))


def _batch_state(chunk: str) -> dict[str, object]:
    entry = {
        "name": chunk, "round": 0, "lines": 2, "bytes": 100, "stage": "collected",
        "written_at": 1.0, "not_before": 0.0, "file_id": "f", "batch_id": "b", "status":
        "completed", "answered": 2, "error": None, "gen": 0, "parent": None,
    }  # fmt: skip
    return {"version": 1, "chunks": {chunk: entry}, "failed": {}, "finished": True, "gen": 0}


def _files(out: Path, memo: Path) -> dict[str, Path]:
    """One state file of each kind in the template (a copy of OUTDIR and of the memo folder)."""
    state = out / "_ctxprec"
    verdicts = sorted((state / "verdicts").rglob("*.arrow"))
    assert verdicts, "the offline run keeps its verdicts in OUTDIR"
    found = {
        "manifest": state / "manifest.json",
        "run": state / "run.json",
        "estimate": state / "estimate.json",
        "commit": sorted((state / "parts").glob("*.json"))[0],
        "pending": sorted((state / "parts").glob("*.pending"))[0],
        "sink": state / "sink-0123456789abcdef.json",
        "batch_state": state / "batches" / "state.json",
        "ids": sorted((state / "batches").glob("*.ids"))[0],
        "verdicts": verdicts[0],
        "part": sorted(out.glob("part-*.parquet"))[1],
        "lock": state / "lock",
        "memo_db": memo / "cache.db",
        "journal": memo / "journal" / "0123456789abcdef.jsonl",
        "journal_dir": memo / "journal",
        "memo_lock": memo / "ctxprec-open.lock",
    }
    return found


def _json_fields(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return sorted(data) if isinstance(data, dict) else []


def _set(field: str, value: object) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        data = json.loads(path.read_text())
        data[field] = value
        path.write_text(json.dumps(data))

    return mutate


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random(path: Path) -> None:
    path.write_bytes(random.Random(path.name).randbytes(300))


def _as_file(mutate: Callable[[Path], None]) -> Callable[[Path], None]:
    """`mutate` for a kind that is a folder (the journal folder): a file in its place first."""

    def on_file(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            path.write_text("[]")
        mutate(path)

    return on_file


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": lambda p: p.write_bytes(b""),
    "list": lambda p: p.write_text("[]"),
    "null": lambda p: p.write_text("null"),
    "random": _random,
    "deep": lambda p: p.write_text("[" * 100_000),
}

# each kind of state file, and the commands that read it back
READERS = {
    "manifest": ["same", "--overwrite", "--incremental", "summary"],
    "run": ["same", "--overwrite", "summary"],
    "estimate": ["same", "--overwrite"],
    "commit": ["same", "--overwrite", "--incremental", "summary"],
    "pending": ["same", "--overwrite", "--incremental"],
    "sink": ["same", "--overwrite"],
    "batch_state": ["same", "--overwrite", "batches"],
    "ids": ["read_ids", "batches"],  # read by a --batch-api run only: its reader, in-process
    "verdicts": ["same", "--overwrite"],
    "part": ["same", "--overwrite", "--incremental", "summary", "view"],
    "lock": ["same", "--overwrite", "summary", "view"],
    "memo_db": ["same", "--overwrite", "cache_info"],
    "journal": ["same"],
    "journal_dir": ["same", "cache_info"],
    "memo_lock": ["same", "cache_info"],
}
MEMO_KINDS = ("memo_db", "journal", "journal_dir", "memo_lock")

# top-level fields of each JSON kind, each set to null and to a string
FIELDS = {
    "manifest": ["fingerprint", "config_fingerprint", "status", "incremental", "command",
                 "describe"],
    "run": ["wall_s", "rows_this_run", "judge", "price", "engine", "notices", "history",
            "estimate", "sinks", "incremental", "judge_calls", "input"],
    "estimate": ["calls", "input_tokens", "cost_usd", "wall_s", "judge_model"],
    "commit": ["key", "files", "rows", "failed"],
    "pending": ["key", "files"],
    "sink": ["loaded"],
    "batch_state": ["chunks", "failed", "finished", "gen", "version"],
    "lock": ["host", "pid", "started_at", "command", "token"],
}  # fmt: skip


def _cases() -> Iterator[object]:
    for kind, commands in READERS.items():
        for name in [*MUTATIONS, "symlink"]:
            yield pytest.param(kind, name, commands, id=f"{kind}-{name}")
        few = [c for c in commands if c in ("same", "summary")]
        for field in FIELDS.get(kind, []):
            for label in ("null", "abc"):
                yield pytest.param(kind, f"{field}={label}", few, id=f"{kind}-{field}={label}")


def _mutation(name: str, outside: Path) -> Callable[[Path], None]:
    if name == "symlink":

        def link(path: Path) -> None:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
                path.symlink_to(outside, target_is_directory=True)
                return
            path.unlink(missing_ok=True)
            path.symlink_to(outside / "secret.txt")

        return link
    if "=" in name:
        field, label = name.split("=")
        return _set(field, {"null": None, "abc": "abc", "list": []}[label])
    return _as_file(MUTATIONS[name])


def _run(command: str, source: Path, out: Path, memo: Path) -> int:
    if command == "read_ids":
        store = BatchStore.load(out)
        try:
            store.read_ids(next(iter(store.chunks)))
        except UserError as exc:
            print(f"ctxprec: error: {exc}", file=sys.stderr)
            return exc.exit_code
        return 0
    if command == "summary":
        return main(["summary", str(out)])
    if command == "batches":
        return main(["batches", str(out)])
    if command == "cache_info":
        return main(["cache", "info", "--cache-dir", str(memo)])
    if command == "view":
        return _view(out)
    extra = [] if command == "same" else [command]
    return score(source, "-o", out, *RUN, *extra)


def _view(out: Path) -> int:
    """`ctxprec view OUT`: refused (its exit code, its lines printed here) or serving (its
    /api/info answered, then stopped with SIGINT: 0 here). A viewer that blocks fails the test
    (`Started` waits 60 s for its first line)."""
    from tests.fakes.viewer import Started, get

    started = Started(out)
    status = get(started.url + "api/info")[0] if started.url else None
    code, err = started.stop()
    print(err, file=sys.stderr, end="")
    if started.url is None:
        return code
    assert status == 200, err
    assert code == 130, err
    return 0


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _rows(out: Path) -> int:
    return int(json.loads((out / "summary.json").read_text())["rows"]["total"])


@pytest.mark.parametrize(("kind", "damage", "commands"), list(_cases()))
def test_damaged_state_is_refused_in_one_line_or_recovered(
    kind: str,
    damage: str,
    commands: list[str],
    template: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, original = template
    outside = tmp_path / "outside"  # a sentinel folder: a link points into it
    outside.mkdir()
    (outside / "secret.txt").write_text("not ctxprec's\n")
    (outside / "0123456789abcdef.jsonl").write_text("a user's log, named as a journal\n")
    sentinel = _tree_hash(outside)
    for command in commands:
        out = tmp_path / f"out-{command.strip('-')}"
        memo = tmp_path / f"memo-{command.strip('-')}"
        shutil.copytree(original, out, symlinks=True)
        shutil.copytree(original.parent / "memo", memo, symlinks=True)
        monkeypatch.setenv("CTXPREC_CACHE_DIR", str(memo))
        target = _files(out, memo)[kind]
        if damage.partition("=")[0] not in _json_fields(target) and "=" in damage:
            pytest.skip(f"{kind} has no field {damage}")
        if not os.path.lexists(target):
            target.write_text("")  # the open lock: made by the first open, kept afterwards
        _mutation(damage, outside)(target)
        before, memo_before = checksums(out), _tree_hash(memo)
        capsys.readouterr()
        code = _run(command, source, out, memo)
        err = capsys.readouterr().err
        where = f"{kind} {damage}, {command}: exit {code}\n{err}"
        assert code in (0, 2), where
        assert "Traceback" not in err, where
        assert "internal error" not in err, where
        assert _tree_hash(outside) == sentinel, where
        if code == 2:
            errors = [line for line in err.splitlines() if line.startswith("ctxprec: error:")]
            assert len(errors) == 1, where
            after = checksums(out)
            if kind != "lock":  # a lock kept by a refusal is named by the checks below
                after.pop("_ctxprec/lock", None)
                before.pop("_ctxprec/lock", None)
            assert after == before, where  # nothing changed: `_SUCCESS` is still there
            assert _tree_hash(memo) == memo_before, where
        elif command not in ("summary", "batches", "read_ids", "cache_info", "view"):
            assert (out / "_SUCCESS").is_file(), where
            assert _rows(out) == ROWS, where  # recovered: every row is there
        shutil.rmtree(out)
        shutil.rmtree(memo)
