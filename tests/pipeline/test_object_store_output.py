"""OUTDIR in an object store, against a real S3 protocol server on loopback (moto's server mode):
input and output in a bucket, kill -9 mid-run then the same command (every row equals the MAP of
the judge's verdicts, each id once, read back with Polars from the bucket; a third run makes no
judge call), incremental nights into a bucket, and the user's objects in an output are safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs
import pytest

from ctxprec.cli.batches import list_batches
from ctxprec.cli.main import main
from ctxprec.storage.core.errors import ConfigError, OutputError
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.files.objpath import ObjPath, out_path
from ctxprec.storage.outdir.lock import OutdirLock
from tests.fakes.inputs import HOTPOT_MAP, REPO
from tests.fakes.judge_server import FakeJudgeConfig, expected_verdict
from tests.fakes.runs import fake_stats
from tests.fakes.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

pytestmark = pytest.mark.slow  # a moto S3 server, real processes killed


def upload_rows(
    s3_server: S3Server, hotpot: Path, tmp: Path, key: str, n: int, skip: int = 0
) -> Path:
    local = tmp / f"{key.replace('/', '_')}"
    pl.read_parquet(hotpot).slice(skip, n).write_parquet(local)
    s3_server.upload(local, key)
    return local


def from_bucket(s3_server: S3Server, prefix: str) -> pl.DataFrame:
    """Every Parquet file below `prefix`, read by Polars straight from the bucket."""
    options = {
        "aws_endpoint_url": s3_server.endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    return pl.read_parquet(
        f"s3://{prefix}/**/*.parquet", storage_options=options, hive_partitioning=True
    )


def keys(s3_server: S3Server, prefix: str) -> list[str]:
    found = s3_server.filesystem().get_file_info(pafs.FileSelector(prefix, recursive=True))
    return sorted(f.path for f in found if f.type == pafs.FileType.File)


def check_map(got: pl.DataFrame, source: Path) -> None:
    src = pl.read_parquet(source).select("id", "contexts")
    assert got.get_column("id").is_unique().all()
    joined = got.join(src, on="id")
    assert joined.height == src.height == got.height
    for row in joined.iter_rows(named=True):
        verdicts = [expected_verdict(item, FakeJudgeConfig()) for item in row["contexts"]]
        assert row["status"] == "ok", row["error"]
        assert row["verdicts"] == verdicts
        assert row["score"] == map_score(verdicts)


def command(src: str, out: str) -> list[str]:
    return [
        sys.executable, "-m", "ctxprec.cli.main", "score", src, "-o", out,
        "--model", "openai/judge", *HOTPOT_MAP, "--batch-rows", "10", "--concurrency", "8",
        "--progress", "off",
    ]  # fmt: skip


def test_kill_9_then_the_same_command_in_a_bucket(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    server: str,
) -> None:
    source = upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/rows.parquet", 120)
    out = f"s3://{bucket}/scores/"
    env = {**os.environ, **s3_server.env()}
    env.update(OPENAI_BASE_URL=server, OPENAI_API_KEY="sk-s3")
    env["CTXPREC_CACHE_DIR"] = str(tmp_path / "c")
    kills = 0
    for delay in (3.0, 5.0):  # past the start-up, lock and first parts
        proc = subprocess.Popen(
            command(f"s3://{bucket}/in/", out),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 1
    done = subprocess.run(command(f"s3://{bucket}/in/", out), cwd=REPO, env=env, text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{bucket}/scores/_SUCCESS" in keys(s3_server, bucket)
    check_map(from_bucket(s3_server, f"{bucket}/scores"), source)
    assert SECRET_KEY not in done.stdout + done.stderr
    calls = int(fake_stats(server)["total"])
    again = subprocess.run(command(f"s3://{bucket}/in/", out), cwd=REPO, env=env, text=True,
                           capture_output=True)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert int(fake_stats(server)["total"]) == calls  # type: ignore[arg-type]
    check_map(from_bucket(s3_server, f"{bucket}/scores"), source)
    assert not any("lock" in k.rsplit("/", 1)[-1] for k in keys(s3_server, bucket))  # given back
    for key in keys(s3_server, f"{bucket}/scores"):
        assert SECRET_KEY.encode() not in s3_server.filesystem().open_input_stream(key).read()


def test_a_prefix_holding_other_objects_is_refused_and_user_objects_stay(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    server: str,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s3")
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "c"))
    upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/rows.parquet", 20)
    s3_server.put(f"{bucket}/theirs/report.parquet", b"not ours")
    args = ["score", f"s3://{bucket}/in/", "--model", "openai/judge", *HOTPOT_MAP,
            "--progress", "off"]  # fmt: skip
    assert main([*args, "-o", f"s3://{bucket}/theirs"]) == 2
    assert "holds files ctxprec did not write" in capsys.readouterr().err
    assert int(fake_stats(server)["total"]) == 0  # type: ignore[arg-type]
    assert keys(s3_server, f"{bucket}/theirs") == [f"{bucket}/theirs/report.parquet"]

    assert main([*args, "-o", f"s3://{bucket}/scores"]) == 0
    s3_server.put(f"{bucket}/scores/notes/mine.parquet", b"user bytes")
    assert main([*args, "-o", f"s3://{bucket}/scores", "--overwrite"]) == 0
    assert "did not write" in capsys.readouterr().err  # warned, not read, not removed
    data = s3_server.filesystem().open_input_stream(f"{bucket}/scores/notes/mine.parquet").read()
    assert data == b"user bytes"
    assert main(["summary", f"s3://{bucket}/scores"]) == 0
    assert f"{bucket}/scores/summary.json" in keys(s3_server, bucket)


def test_incremental_nights_into_a_bucket(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: str,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s3")
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "c"))
    first = upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/logs/dt=2026-11-28/a.parquet", 15)
    second = upload_rows(
        s3_server, hotpot, tmp_path, f"{bucket}/logs/dt=2026-11-29/a.parquet", 15, 15
    )
    for night in ("2026-11-28", "2026-11-29"):
        assert main(["score", f"s3://{bucket}/logs/dt={night}", "-o", f"s3://{bucket}/scores",
                     "--incremental", "--partition-by", "dt", "--model", "openai/judge",
                     *HOTPOT_MAP, "--progress", "off"]) == 0  # fmt: skip
    got = from_bucket(s3_server, f"{bucket}/scores")
    assert sorted(set(got.get_column("dt").cast(pl.String))) == ["2026-11-28", "2026-11-29"]
    both = pl.concat([pl.read_parquet(first), pl.read_parquet(second)])
    both.write_parquet(tmp_path / "both.parquet")
    check_map(got.drop("dt"), tmp_path / "both.parquet")
    assert any("/dt=2026-11-29/" in k for k in keys(s3_server, f"{bucket}/scores"))


def test_verdicts_in_the_bucket_serve_a_run_with_an_empty_local_memo(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: str,
) -> None:
    """Another machine (a new --cache-dir) re-scoring the same OUTDIR calls the judge for
    nothing: the verdicts the first run paid for are read from OUTDIR/_ctxprec/verdicts."""
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s3")
    source = upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/rows.parquet", 20)
    args = ["score", f"s3://{bucket}/in/", "-o", f"s3://{bucket}/scores", "--model",
            "openai/judge", *HOTPOT_MAP, "--progress", "off"]  # fmt: skip
    assert main([*args, "--cache-dir", str(tmp_path / "first")]) == 0
    calls = int(fake_stats(server)["total"])
    assert calls > 0
    assert any("/_ctxprec/verdicts/" in k for k in keys(s3_server, f"{bucket}/scores"))
    # --overwrite drops the parts and run state but keeps the verdict store (a memo)
    assert main([*args, "--cache-dir", str(tmp_path / "second"), "--overwrite"]) == 0
    assert int(fake_stats(server)["total"]) == calls  # type: ignore[arg-type]
    check_map(from_bucket(s3_server, f"{bucket}/scores"), source)


def test_dask_engine_reads_and_writes_the_bucket(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Input and OUTDIR in the bucket, nothing shared on disk: the workers read their files and
    commit their parts through the object store; same rows as the local engine."""
    pytest.importorskip("distributed")
    for i in range(2):
        upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/p{i}.parquet", 15, i * 15)
    base = ["score", f"s3://{bucket}/in", *HOTPOT_MAP, "--progress", "off", "--batch-rows", "5"]
    assert main([*base, "-o", f"s3://{bucket}/local"]) == 0
    assert main([*base, "-o", f"s3://{bucket}/dask", "--engine", "dask", "--workers", "2"]) == 0
    want = from_bucket(s3_server, f"{bucket}/local").drop("scored_at").sort("id")
    got = from_bucket(s3_server, f"{bucket}/dask").drop("scored_at").sort("id")
    assert got.height == 30
    assert got.equals(want)
    run = s3_server.filesystem().open_input_stream(f"{bucket}/dask/_ctxprec/run.json").read()
    assert b'"name": "dask"' in run
    assert f"{bucket}/dask/_SUCCESS" in keys(s3_server, f"{bucket}/dask")
    # compare reads both sides from the bucket: the same verdicts, no difference
    capsys.readouterr()
    assert main(["compare", f"s3://{bucket}/local", f"s3://{bucket}/dask", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_pairs"] == 30
    assert report["mean_a"] == report["mean_b"]


def test_lease_lock_in_a_bucket(s3_server: S3Server, bucket: str) -> None:
    """One writer per OUTDIR in a bucket too: a second lock is refused while the first is held,
    the lease is removed on release, and a lease of a dead process on this host is taken over."""
    out = out_path(f"s3://{bucket}/scores")
    first = OutdirLock(out, settle_s=0.05, log=lambda line: None)
    first.acquire()
    with pytest.raises(OutputError, match="is being written by"):
        OutdirLock(out, settle_s=0.05, log=lambda line: None).acquire()
    first.release()
    assert keys(s3_server, f"{bucket}/scores") == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = {**first.holder.__dict__, "pid": int(dead.stdout), "token": "gone"}
    s3_server.put(f"{bucket}/scores/_ctxprec/lock", json.dumps(gone).encode())
    taken: list[str] = []
    second = OutdirLock(out, settle_s=0.05, log=taken.append)
    second.acquire()
    assert "taking over" in taken[0]
    assert "is no longer running" in taken[0]
    assert (
        second.holder.token.encode()
        in s3_server.filesystem().open_input_stream(f"{bucket}/scores/_ctxprec/lock").read()
    )
    second.release()


def test_batches_and_batch_api_refuse_an_object_store_outdir(
    s3_server: S3Server, bucket: str
) -> None:
    with pytest.raises(ConfigError, match="object store"):
        list_batches(out_path(f"s3://{bucket}/scores"))


def test_estimate_saved_into_a_bucket_outdir(
    s3_server: S3Server, bucket: str, hotpot: Path, tmp_path: Path
) -> None:
    upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/rows.parquet", 10)
    out = f"s3://{bucket}/scores"
    assert main(["estimate", f"s3://{bucket}/in/", *HOTPOT_MAP, "-o", out, "--json"]) == 0
    saved = json.loads(
        s3_server.filesystem().open_input_stream(f"{bucket}/scores/_ctxprec/estimate.json").read()
    )
    assert saved["rows"] == 10
    assert main(["score", f"s3://{bucket}/in/", *HOTPOT_MAP, "-o", out, "--progress", "off"]) == 0
    summary = json.loads(
        s3_server.filesystem().open_input_stream(f"{bucket}/scores/summary.json").read()
    )
    assert summary["estimate_vs_actual"] is not None


def test_delta_sink_in_the_bucket_from_a_bucket_outdir(
    s3_server: S3Server, bucket: str, hotpot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Delta table lives in the bucket too (delta-rs with the same AWS_* environment; a
    plain-http endpoint is allowed for it); a second run adds no duplicate ids."""
    deltalake = pytest.importorskip("deltalake")
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    upload_rows(s3_server, hotpot, tmp_path, f"{bucket}/in/rows.parquet", 12)
    args = ["score", f"s3://{bucket}/in/", *HOTPOT_MAP, "-o", f"s3://{bucket}/scores",
            "--sink", f"delta:s3://{bucket}/lake", "--progress", "off"]  # fmt: skip
    assert main(args) == 0
    assert main(args) == 0
    options = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true"}
    table = deltalake.DeltaTable(f"s3://{bucket}/lake", storage_options=options)
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == 12 == len(set(ids))


def test_gcs_and_azure_outdirs_resolve_to_object_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: the URIs map to pyarrow's GCS and Azure filesystems and print as typed."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    gcs = out_path("gs://bkt/scores/")
    assert isinstance(gcs, ObjPath)
    assert gcs.fs.type_name == "gcs"
    assert gcs.path == "bkt/scores"
    assert str(gcs / "_SUCCESS") == "gs://bkt/scores/_SUCCESS"
    abfs = out_path("abfs://logs@acct.dfs.core.windows.net/scores")
    assert isinstance(abfs, ObjPath)
    assert abfs.fs.type_name == "abfs"
    assert abfs.path == "logs/scores"
    assert str(abfs / "part.parquet") == "abfs://logs@acct.dfs.core.windows.net/scores/part.parquet"
    assert out_path("file:///data/out") == Path("/data/out")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    with pytest.raises(OutputError, match="needs the storage account"):
        out_path("az://logs/scores")
