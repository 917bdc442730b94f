"""INPUT in an object store, against a real S3 protocol server on loopback (moto's server mode):
Parquet and JSON Lines in a bucket score exactly like the same files on disk, Hive prefixes and
a `dt=` taken from the s3 path become partition columns, the Dask engine reads the bucket, and
the credentials never reach an output, a log line or a message."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from ctxprec.cli.main import main
from ctxprec.connectors.sources import inspect_source, iter_batches
from ctxprec.connectors.sources.files import find_inputs
from ctxprec.storage.core.errors import InputError
from ctxprec.storage.core.settings import StorageSettings
from ctxprec.storage.files import fs
from tests.fakes.inputs import HOTPOT_COLUMNS, HOTPOT_MAP, REPO, SAMPLE
from tests.fakes.s3_server import SECRET_KEY, S3Server


def rows(hotpot: Path, n: int) -> pl.DataFrame:
    return pl.read_parquet(hotpot).head(n)


def scored(src: str | Path, out: Path, *flags: str) -> pl.DataFrame:
    args = ["score", str(src), "-o", str(out), *HOTPOT_MAP, "--progress", "off", *flags]
    assert main(args) == 0
    return pl.read_parquet(out / "**" / "*.parquet").drop("scored_at").sort("id")


def _everything_written(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


def test_parquet_and_jsonl_in_a_bucket_score_like_local_files(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    frame = rows(hotpot, 40)
    frame.slice(0, 25).write_parquet(local / "a.parquet")
    (local / "b.jsonl.gz").write_bytes(gzip.compress(frame.slice(25).write_ndjson().encode()))
    for f in local.iterdir():
        s3_server.upload(f, f"{bucket}/in/{f.name}")
    flags = ("--batch-rows", "10")
    want = scored(local, tmp_path / "from-disk", *flags)
    got = scored(f"s3://{bucket}/in/", tmp_path / "from-s3", *flags)
    assert got.height == 40
    assert got.get_column("id").is_unique().all()
    assert_frame_equal(got, want)
    parts = sorted(p.name for p in (tmp_path / "from-s3").glob("*.parquet"))
    assert parts == sorted(p.name for p in (tmp_path / "from-disk").glob("*.parquet"))
    run = json.loads((tmp_path / "from-s3" / "_ctxprec" / "run.json").read_text())
    assert run["input"] == f"s3://{bucket}/in/"
    printed = capsys.readouterr()
    for text in (printed.out, printed.err):
        assert SECRET_KEY not in text
    assert SECRET_KEY.encode() not in _everything_written(tmp_path / "from-s3")
    # the same command again: every part is done, nothing is judged again
    again = ["score", f"s3://{bucket}/in/", "-o", str(tmp_path / "from-s3"), *HOTPOT_MAP, *flags]
    assert main([*again, "--progress", "off", "--quiet"]) == 0
    quiet = json.loads(capsys.readouterr().out)
    assert quiet["rows_this_run"] == 0
    assert quiet["judge_calls"] == 0


def test_hive_prefix_and_the_days_own_folder_in_a_bucket(
    s3_server: S3Server, bucket: str, hotpot: Path, tmp_path: Path
) -> None:
    frame = rows(hotpot, 30)
    for i, day in enumerate(["2026-11-27", "2026-11-28"]):
        path = tmp_path / f"{day}.jsonl"
        path.write_text(frame.slice(i * 15, 15).write_ndjson())
        s3_server.upload(path, f"{bucket}/logs/dt={day}/region=eu/part-0.jsonl")
    info = inspect_source(f"s3://{bucket}/logs", HOTPOT_COLUMNS, use_extractor=False)
    assert info.partition_columns == ("dt", "region")
    assert info.total_rows == 30
    days = pl.concat([b.frame for b in iter_batches(info, HOTPOT_COLUMNS, batch_rows=100)])
    assert days.get_column("dt").value_counts().sort("dt").rows() == [
        ("2026-11-27", 15),
        ("2026-11-28", 15),
    ]
    # the nightly recipe on the day's own prefix: dt comes from the s3 path itself
    out = tmp_path / "scores"
    night = f"s3://{bucket}/logs/dt=2026-11-28/"
    got = scored(night, out, "--incremental", "--partition-by", "dt")
    assert got.height == 15
    assert (out / "dt=2026-11-28").is_dir()


def test_missing_prefix_and_no_bucket_are_input_errors(
    bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["score", f"s3://{bucket}/nothing/here/", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"input s3://{bucket}/nothing/here does not exist" in err
    assert not (tmp_path / "o").exists()
    code = main(["score", "s3://", "-o", str(tmp_path / "o")])
    assert code == 2
    assert "names no bucket" in capsys.readouterr().err


def test_storage_options_from_the_toml(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[storage] endpoint_url instead of AWS_ENDPOINT_URL; an unknown key is refused."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    path = tmp_path / "in.parquet"
    rows(hotpot, 5).write_parquet(path)
    s3_server.upload(path, f"{bucket}/in.parquet")
    config = tmp_path / "c.toml"
    config.write_text(f'[storage]\nendpoint_url = "{s3_server.endpoint}"\nregion = "us-east-1"\n')
    got = scored(f"s3://{bucket}/in.parquet", tmp_path / "o", "--config", str(config))
    assert got.height == 5
    config.write_text('[storage]\nsecret_access_key = "x"\n')
    assert main(["score", str(path), "-o", str(tmp_path / "p"), "--config", str(config)]) == 2


def test_uri_resolution_keeps_buckets_and_keys() -> None:
    filesystem, path = fs.resolve("s3://b/logs/dt=2026-11-28/", env={"AWS_REGION": "x"})
    assert path == "b/logs/dt=2026-11-28"
    assert filesystem.type_name == "s3"
    local, path = fs.resolve("file:///tmp/x.parquet")
    assert local.type_name == "local"
    assert path == "/tmp/x.parquet"
    assert fs.is_uri("gs://b/k")
    assert fs.is_uri("az://c/k")
    assert not fs.is_uri("logs/dt=1")
    gcs, path = fs.resolve("gs://b/k.jsonl", StorageSettings(endpoint_url="http://127.0.0.1:9"))
    assert gcs.type_name == "gcs"
    assert path == "b/k.jsonl"
    azure_env = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}
    azure, path = fs.resolve("az://logs/day/k.jsonl", env=azure_env)
    assert azure.type_name == "abfs"
    assert path == "logs/day/k.jsonl"
    abfs, path = fs.resolve("abfs://logs@acct.dfs.core.windows.net/k.jsonl", env=azure_env)
    assert abfs.type_name == "abfs"
    assert path == "logs/k.jsonl"
    with pytest.raises(InputError, match="needs the storage account"):
        fs.resolve("az://logs/k.jsonl", env={})


@pytest.mark.slow
def test_dask_engine_reads_the_bucket(
    s3_server: S3Server, bucket: str, hotpot: Path, tmp_path: Path
) -> None:
    pytest.importorskip("distributed")
    frame = rows(hotpot, 30)
    for i in range(2):
        path = tmp_path / f"p{i}.jsonl"
        path.write_text(frame.slice(i * 15, 15).write_ndjson())
        s3_server.upload(path, f"{bucket}/in/p{i}.jsonl")
    flags = ("--batch-rows", "5")
    want = scored(f"s3://{bucket}/in", tmp_path / "local", *flags)
    dask = ("--engine", "dask", "--workers", "2")
    got = scored(f"s3://{bucket}/in", tmp_path / "dask", *flags, *dask)
    assert_frame_equal(got, want)
    run = json.loads((tmp_path / "dask" / "_ctxprec" / "run.json").read_text())
    assert run["engine"]["name"] == "dask"
    assert run["engine"]["tasks"] == 2


def test_bucket_listing_rules_match_local_folders(
    s3_server: S3Server, bucket: str, hotpot: Path, tmp_path: Path
) -> None:
    """Output folders inside the input prefix, `_`/`.` names and unknown files are not input
    (the unknown ones are named); globs work on URIs, `**/` matching no folder too."""
    path = tmp_path / "a.parquet"
    rows(hotpot, 5).write_parquet(path)
    s3_server.upload(path, f"{bucket}/in/a.parquet")
    s3_server.upload(path, f"{bucket}/in/day/b.parquet")
    s3_server.upload(path, f"{bucket}/in/scores/part-00000-00000.parquet")
    s3_server.put(f"{bucket}/in/scores/_ctxprec/manifest.json", b"{}")
    s3_server.upload(path, f"{bucket}/in/_tmp/c.parquet")
    s3_server.put(f"{bucket}/in/readme.txt", b"about")
    found = find_inputs(f"s3://{bucket}/in")
    assert [f.path for f in found.files] == [
        f"s3://{bucket}/in/a.parquet",
        f"s3://{bucket}/in/day/b.parquet",
    ]
    assert found.skipped == (f"s3://{bucket}/in/readme.txt",)
    globbed = find_inputs(f"s3://{bucket}/in/**/*.parquet")
    assert [f.name for f in globbed.files] == ["a.parquet", "b.parquet"]


def _readme_bucket_commands() -> list[str]:
    text = (REPO / "docs" / "inputs.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S) if "s3://my-" in b)
    return [line for line in block.splitlines() if line.startswith("ctxprec ")]


@pytest.mark.slow
def test_readme_bucket_commands_run_as_written(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    s3_server.create_bucket("my-bucket")
    sample = pl.read_parquet(SAMPLE)
    s3_server.put("my-bucket/logs/dt=2026-11-28/part-0.jsonl", sample.write_ndjson().encode())
    for i, key in enumerate(["exports/2026/11/a.jsonl.gz", "exports/b.jsonl.gz"]):
        data = sample.slice(i * 6, 6).write_ndjson().encode()
        s3_server.put(f"my-bucket/{key}", gzip.compress(data))
    commands = _readme_bucket_commands()
    assert len(commands) == 3
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert SECRET_KEY not in done.stdout + done.stderr
    day = pl.read_parquet(tmp_path / "scores" / "dt=2026-11-28" / "*.parquet")
    assert day.height == 12
    exports = pl.read_parquet(tmp_path / "exports-scores" / "*.parquet")
    assert exports.height == 12
    assert exports.get_column("id").is_unique().all()
    # the third: input and output in the bucket
    fs = s3_server.filesystem()
    found = fs.get_file_info(pafs.FileSelector("my-bucket/scores", recursive=True))
    parts = [f.path for f in found if f.path.endswith(".parquet")]
    assert parts == ["my-bucket/scores/part-00000-00000.parquet"]
    assert pq.read_table(parts[0], filesystem=fs).num_rows == 12
    assert fs.get_file_info("my-bucket/scores/_SUCCESS").type == pafs.FileType.File


def test_estimate_reads_the_bucket(
    s3_server: S3Server,
    bucket: str,
    hotpot: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "a.ndjson.zst"
    frame = rows(hotpot, 12)
    with pa.output_stream(str(path), compression="zstd") as out:
        out.write(frame.write_ndjson().encode())
    s3_server.upload(path, f"{bucket}/in/a.ndjson.zst")
    capsys.readouterr()
    assert main(["estimate", f"s3://{bucket}/in", *HOTPOT_MAP, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["rows"] == 12
    assert est["context_items"] == frame.get_column("contexts").list.len().sum()
