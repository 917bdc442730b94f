"""`ctxprec batches OUTDIR`: the provider batches of an output folder with their status
(refreshed from the provider when its key is in the environment), counts and age; `--cancel`
cancels the live ones.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from connectors.judges.batch.api import create_batch_client
from connectors.judges.batch.client import BatchClient, RemoteBatch
from connectors.judges.retry import RetryClock
from storage.batches import BatchStore
from storage.core.errors import ConfigError
from storage.core.settings import JudgeSettings
from storage.objpath import ObjPath, OutPath

__all__ = ["list_batches", "render_batches"]


def list_batches(
    outdir: OutPath, *, cancel: bool = False, retry_clock: RetryClock | None = None
) -> list[dict[str, Any]]:
    """The batches of OUTDIR with their status (refreshed from the provider when its key is
    in the environment), counts and age; `cancel` cancels the live ones."""
    if isinstance(outdir, ObjPath):
        raise ConfigError(
            f"{outdir} is in an object store, where no provider batches are kept: --batch-api "
            "runs write to local folders only"
        )
    store = BatchStore.load(outdir)
    if not store.exists():
        raise ConfigError(
            f"{outdir} holds no provider batches (no {store.path}); they are made by "
            "`ctxprec score ... --batch-api -o OUTDIR`"
        )
    return anyio.run(_list, store, cancel, retry_clock)


async def _list(
    store: BatchStore, cancel: bool, retry_clock: RetryClock | None
) -> list[dict[str, Any]]:
    saved = dict(store.data.get("settings") or {})
    saved["providers"] = tuple(
        (str(name), tuple((str(k), str(v)) for k, v in flat))
        for name, flat in saved.get("providers") or ()
    )
    settings = JudgeSettings(**saved)
    client: BatchClient | None = None
    try:
        client = create_batch_client(settings, retry_clock=retry_clock)
    except ConfigError:
        if cancel:
            raise
    rows = []
    try:
        for chunk in sorted(store.chunks.values(), key=lambda c: c["name"]):
            remote: RemoteBatch | None = None
            live = chunk["stage"] != "collected"
            if client is not None and chunk.get("batch_id") and live:
                if cancel:
                    remote = await client.cancel(chunk["batch_id"])
                else:
                    remote = await client.poll(chunk["batch_id"])
                store.update(chunk["name"], status=remote.status, answered=remote.answered)
            elif cancel and live:  # not sent yet: never send it
                store.update(chunk["name"], stage="collected", status="dropped")
            since = chunk.get("created_at") or chunk.get("written_at")
            rows.append(
                {
                    "batch_id": chunk.get("batch_id"),
                    "chunk": chunk["name"],
                    "status": chunk.get("status") or chunk["stage"],
                    "collected": chunk["stage"] == "collected",
                    "lines": int(chunk["lines"]),
                    "answered": int(chunk.get("answered") or 0),
                    "round": int(chunk["round"]),
                    "age_s": round(time.time() - float(since), 1) if since else None,
                }
            )
    finally:
        if client is not None:
            await client.aclose()
    return rows


def render_batches(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "ctxprec: no batches"
    out = [f"{'batch':<40} {'status':<22} {'answered':>17} {'round':>5} {'age':>8}"]
    for r in rows:
        age = "—" if r["age_s"] is None else _age(float(r["age_s"]))
        status = r["status"] + ("" if not r["collected"] else " (collected)")
        out.append(
            f"{r['batch_id'] or '(not sent) ' + r['chunk']:<40} {status:<22} "
            f"{r['answered']:>8,}/{r['lines']:<8,} {r['round']:>5} {age:>8}"
        )
    return "\n".join(out)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
