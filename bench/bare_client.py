"""The baseline of bench/throughput.py: a bare aiohttp loop, run as its own process.

N tasks share one ClientSession and post the same chat-completions bodies ctxprec sends (built
with ctxprec's own prompts, one per context item of the input, in input order) until `--calls`
calls are done, parsing each reply's verdict JSON. No retries, no memo, no output: the floor of
client work per call. Prints one JSON line: calls, ok, errors, wall_s (of the loop).

Usage: python bench/bare_client.py --url http://127.0.0.1:PORT/v1 --input X.parquet \
    --calls 8000 --concurrency 64 [--read file|dataset]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ctxprec.connectors.judges.base import ItemRequest  # noqa: E402
from ctxprec.connectors.judges.prompts import ITEM_SCHEMA, item_messages  # noqa: E402


def requests_of(path: Path, limit: int, read: str = "file") -> Iterator[ItemRequest]:
    """One request per context item, in input order, at most `limit`. `read` "file" reads with
    ParquetFile (the lean floor); "dataset" with pq.read_table, as this loop did when the first
    hot-path figures were taken: it goes through pyarrow.dataset, which imports pandas (~0.35 s of
    CPU that no judge call needs)."""
    columns = ["query", "expected_output", "contexts"]
    if read == "dataset":
        table = pq.read_table(path, columns=columns)
    else:
        table = pq.ParquetFile(path).read(columns=columns)
    n = 0
    for q, e, items in zip(*(table.column(i).to_pylist() for i in range(3)), strict=True):
        for item in items:
            if n >= limit:
                return
            n += 1
            yield ItemRequest(q, e, item)


def body_for(request: ItemRequest, model: str) -> dict[str, Any]:
    """The same JSON body ctxprec's OpenAI judge posts for one item."""
    system, user = item_messages(request)
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": 0.0,
        "max_tokens": 200,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": ITEM_SCHEMA, "strict": True},
        },
    }


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    todo: Iterator[ItemRequest],
    counts: dict[str, int],
) -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    for request in todo:  # a shared iterator: each call is taken by exactly one task
        async with session.post(url, json=body_for(request, model), headers=headers) as resp:
            data = await resp.json(content_type=None)
        if resp.status == 200:
            json.loads(data["choices"][0]["message"]["content"])["relevant"]
            counts["ok"] += 1
        else:
            counts["errors"] += 1


async def run(
    url: str, input_path: Path, calls: int, concurrency: int, model: str, read: str = "file"
) -> dict[str, Any]:
    """Make `calls` calls with `concurrency` tasks over one session; wall time of the loop."""
    todo = iter(list(requests_of(input_path, calls, read)))
    counts = {"ok": 0, "errors": 0}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=60.0)
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        asyncio.TaskGroup() as tg,
    ):
        for _ in range(concurrency):
            tg.create_task(_worker(session, f"{url}/chat/completions", model, todo, counts))
    wall = time.perf_counter() - started
    return {"calls": counts["ok"] + counts["errors"], **counts, "wall_s": wall}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL ending in /v1")
    parser.add_argument("--input", type=Path, required=True, help="Parquet made by the bench")
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--model", default="fake")
    parser.add_argument(
        "--read",
        choices=("file", "dataset"),
        default="file",
        help="file: pq.ParquetFile (default); dataset: pq.read_table, which imports pandas",
    )
    args = parser.parse_args(argv)
    result = asyncio.run(
        run(args.url, args.input, args.calls, args.concurrency, args.model, args.read)
    )
    print(json.dumps(result))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
