"""Memory of `ctxprec view` on a large output: RSS of the server process after start-up and
after each query a user makes (page 1, a search, a filter, a sort, a deep page, a row, the
pairs of two outputs), against the same queries on a small output, side by side.

The output is generated cheaply in the output schema (Polars writes the part files directly,
10 parts of ROWS/10; a real `score` of the sample supplies the manifest and run record, commit
records name the generated parts), so a million rows take seconds, not a judge run. RSS is
/proc/PID/status VmRSS after each answer and VmHWM (the high-water mark) at the end.

Usage: python bench/view_memory.py [--rows 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
PARTS = 10
QUERIES = [
    ("start-up (info)", "/api/info"),
    ("page 1", "/api/rows?size=50"),
    ("search in id and query", "/api/rows?q=row+77777&size=50"),
    ("status=failed, band=low", "/api/rows?status=failed&size=50"),
    ("band low, group dense", "/api/rows?band=low&group_by=retriever&group=dense&size=50"),
    ("sort by score, page 1", "/api/rows?sort=-score&size=50"),
    ("sort by score, deep page", "/api/rows?sort=score&size=200&page=4000"),
    ("file order, last page", "/api/rows?size=200&page=5000"),
    ("open a row", "/api/row/{last}"),
    ("pairs, largest change", "/api/compare?sort=change&size=50"),
    ("open a pair", "/api/pair/{middle}"),
]


def _row_id(i: int) -> str:
    return f"row-{i:07d}"


def _part(start: int, n: int, shift: int) -> pl.DataFrame:
    i = pl.int_range(start, start + n, eager=True)
    k = (i * 7919 + shift) % 11  # 0..10 items per row
    frame = pl.DataFrame({"i": i, "k": k}).with_columns(
        pl.format("row-{}", pl.col("i").cast(pl.String).str.zfill(7)).alias("id"),
        pl.when(pl.col("i") % 2 == 0)
        .then(pl.lit("dense"))
        .otherwise(pl.lit("bm25"))
        .alias("retriever"),
        pl.format("What is the answer to question row {} about topic {}?", "i", "k").alias("query"),
    )
    verdicts = [((j * 31 + shift) % 3 == 0) for j in range(10)]
    rows = frame.with_columns(
        pl.lit(verdicts).list.head(pl.col("k")).alias("verdicts"),
        pl.lit([f"Reason {j}: holds {j} of 9 key terms of the expected output." for j in range(10)])
        .list.head(pl.col("k"))
        .alias("verdict_reasons"),
    )
    rows = rows.with_columns(
        pl.when(pl.col("i") % 97 == 0).then(pl.lit("failed")).when(pl.col("k") == 0)
        .then(pl.lit("empty_context")).otherwise(pl.lit("ok")).alias("status"),
        (((pl.col("i") * 2654435761 + shift) % 101) / 100).round(2).alias("score"),
    ).with_columns(
        pl.when(pl.col("status") == "failed").then(None).otherwise(pl.col("score")).alias("score"),
        pl.when(pl.col("status") == "failed").then(pl.lit("judge: timeout (item #1)"))
        .alias("error"),
        pl.format("Score {}: {} context items. " + "Criterion: directly contributes. " * 6,
                  "score", "k").alias("reason"),
        pl.col("verdicts").list.sum().cast(pl.Int64).alias("relevant_count"),
        pl.col("k").cast(pl.Int64).alias("context_count"),
        pl.lit("offline").alias("judge_model"),
        pl.lit("cp-item-v3").alias("prompt_version"),
        pl.lit(0, pl.Int64).alias("input_tokens"),
        pl.lit(0, pl.Int64).alias("output_tokens"),
        pl.lit("2026-12-01T00:00:00").str.to_datetime(time_zone="UTC").alias("scored_at"),
    )  # fmt: skip
    return rows.drop("i", "k")


def make_output(root: Path, name: str, rows: int, shift: int) -> Path:
    """A scored sample (manifest, run record) whose parts are replaced by `rows` generated rows."""
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "ctxprec.cli.main",
        "score",
        str(ROOT / "examples" / "sample.parquet"),
    ]
    flags = ["-o", str(out), "--passthrough", "retriever,query", "--group-by", "retriever"]
    subprocess.run([*cmd, *flags, "--progress", "off"], check=True, capture_output=True, cwd=ROOT)
    records = out / "_ctxprec" / "parts"
    for old in records.glob("*.json"):
        for rel in json.loads(old.read_text())["files"]:
            (out / rel).unlink()
        old.unlink()
    size = -(-rows // PARTS)
    for p in range(PARTS):
        n = min(size, rows - p * size)
        if n <= 0:
            break
        key = f"{p:05d}-00000"
        _part(p * size, n, shift).write_parquet(out / f"part-{key}.parquet", compression="zstd")
        record = {"key": key, "files": [f"part-{key}.parquet"], "rows": n, "failed": 0}
        (records / f"{key}.json").write_text(json.dumps(record))
    return out


def rss(pid: int) -> dict[str, float]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) / 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def measure(a: Path, b: Path, rows: int) -> list[tuple[str, float, float]]:
    cmd = [sys.executable, "-m", "ctxprec.cli.main", "view", str(a), str(b), "--port", "0"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert server.stdout is not None
    url = re.search(r"http://\S+/", server.stdout.readline()).group(0).rstrip("/")  # type: ignore[union-attr]
    got = []
    try:
        for label, path in QUERIES:
            path = path.format(last=_row_id(rows - 1), middle=_row_id(rows // 2))
            t0 = time.perf_counter()
            with urllib.request.urlopen(url + path, timeout=600) as response:
                assert response.status == 200, path
                response.read()
            got.append((label, time.perf_counter() - t0, rss(server.pid)["VmRSS"]))
        got.append(("peak (VmHWM)", 0.0, rss(server.pid)["VmHWM"]))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="generate the outputs here and keep them")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ctxprec-view-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        sizes = {}
        for rows in (1_000, args.rows):
            t0 = time.perf_counter()
            a = make_output(root, f"a-{rows}", rows, 0)
            b = make_output(root, f"b-{rows}", rows, 13)
            made = time.perf_counter() - t0
            mib = sum(f.stat().st_size for f in a.glob("*.parquet")) / 2**20
            print(
                f"{rows:,} rows per output: generated in {made:.1f} s, {mib:.1f} MiB of parts each"
            )
            sizes[rows] = measure(a, b, rows)
        small, large = sizes[1_000], sizes[args.rows]
        print(
            f"\n| query | RSS MiB, 1,000 rows | RSS MiB, {args.rows:,} rows | s ({args.rows:,}) |"
        )
        print("| --- | ---: | ---: | ---: |")
        for (label, _, r_small), (_, secs, r_large) in zip(small, large, strict=True):
            print(f"| {label} | {r_small:.0f} | {r_large:.0f} | {secs:.2f} |")
        print(f"\npeak ratio {args.rows:,} / 1,000 rows: {large[-1][2] / small[-1][2]:.2f}x")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
