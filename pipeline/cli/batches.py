"""`ctxprec batches OUTDIR`: the provider batches of an output folder with their status
(refreshed from the provider when its key is in the environment), counts and age; `--cancel`
cancels the live ones.

Where the batches are asked about, and with which key, comes from the command line, the config
file and the environment only. OUTDIR's batch state is data someone else may have written: it
gives the batch ids and, when no --model is given, the model (a provider of the registry or
of --config, so its URL and key variable are ours), never a URL, a key variable or a provider
table. Where the state names others, one line says so and they are not used.

An audited run (`--audit-model`) keeps the audit judge's batches in a store of their own: they
are listed (and cancelled) after the first judge's, under the same rules, asked where
--audit-base-url (or `[judge] audit_base_url`, CTXPREC_AUDIT_BASE_URL) says, else where the
audit model's provider is (`audit_settings`); its model, when none is given, from the state.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import anyio

from ctxprec.connectors.judges import audit_settings
from ctxprec.connectors.judges.batch.api import create_batch_client
from ctxprec.connectors.judges.batch.client import BatchClient, RemoteBatch
from ctxprec.connectors.judges.registry import resolve_model
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.files.confine import check_tree
from ctxprec.storage.files.objpath import ObjPath, OutPath
from ctxprec.storage.outdir.batches import BatchStore

__all__ = ["list_batches", "render_batches"]


def list_batches(
    outdir: OutPath,
    *,
    cancel: bool = False,
    seams: Seams = DEFAULT,
    judge: JudgeSettings | None = None,
) -> list[dict[str, Any]]:
    """The batches of OUTDIR with their status (refreshed from the provider when its key is
    in the environment), counts and age; `cancel` cancels the live ones. `judge`: the settings
    from the command line, config and environment (default: the environment's)."""
    if isinstance(outdir, ObjPath):
        raise ConfigError(
            f"{outdir} is in an object store, where no provider batches are kept: --batch-api "
            "runs write to local folders only"
        )
    check_tree(outdir)  # the state is updated where no link leads
    store = BatchStore.load(outdir)
    audit = BatchStore.load(outdir, audit=True)  # --audit-model: the audit judge's batches
    if not store.exists() and not audit.exists():
        raise ConfigError(
            f"{outdir} holds no provider batches (no {store.path}); they are made by "
            "`ctxprec score ... --batch-api -o OUTDIR`"
        )
    judge = judge or JudgeSettings()
    rows = []
    if store.exists():
        settings = trusted_settings(store.data, judge)
        rows = [r | {"judge": "judge"} for r in anyio.run(_list, store, settings, cancel, seams)]
    if audit.exists():
        found = _audit_trusted(audit.data, judge)
        if found is None and cancel:
            raise ConfigError(
                "the audit judge's batches cannot be cancelled without its model: give "
                "--audit-model (and --audit-base-url) as the score run had them"
            )
        rows += [r | {"judge": "audit"} for r in anyio.run(_list, audit, found, cancel, seams)]
    return rows


def _audit_trusted(state: Any, judge: JudgeSettings) -> JudgeSettings | None:
    """The audit judge's settings as `audit_settings` makes them from `judge` (its model from
    the state when none was given), with `trusted_settings`' line; None when no model is known
    or its provider is not one of ours (then its batches are listed as the state has them)."""
    saved = state.get("settings") if isinstance(state, dict) else None
    model = saved.get("model") if isinstance(saved, dict) else None
    if not judge.audit_model and isinstance(model, str) and model.strip():
        judge = dataclasses.replace(judge, audit_model=printable(model.strip(), 200))
    try:
        settings = audit_settings(judge)
    except ConfigError as err:
        print(f"ctxprec: the audit judge's batches are not asked about: {err}", file=sys.stderr)
        return None
    return None if settings is None else trusted_settings(state, settings, "--audit-base-url")


def trusted_settings(
    state: Any, judge: JudgeSettings, url_flag: str = "--base-url"
) -> JudgeSettings:
    """`judge`, with the state's model when none was given (the default model); a line on
    stderr when the state names a base URL or key variable that `judge` does not."""
    saved = state.get("settings") if isinstance(state, dict) else None
    saved = saved if isinstance(saved, dict) else {}
    model = saved.get("model")
    if judge.model == JudgeSettings().model and isinstance(model, str) and model.strip():
        judge = dataclasses.replace(judge, model=printable(model.strip(), 200))
    ours = {"base_url": _endpoint(judge), "api_key_env": judge.api_key_env}
    ignored = [
        f"{label} {printable(str(saved[key]), 200)}"
        for key, label in (("base_url", "base URL"), ("api_key_env", "key variable"))
        if saved.get(key) not in (None, ours[key])
    ]
    if ignored or saved.get("providers"):
        named = " and ".join(ignored) or "a provider table"
        print(
            f"ctxprec: the batch state names {named}; not used: where batches are asked about "
            f"comes from the command line, --config and the environment only (give {url_flag}, "
            "--api-key-env or --config as the score run had them)",
            file=sys.stderr,
        )
    return judge


def _endpoint(judge: JudgeSettings) -> str | None:
    """The base URL `judge` resolves to (--base-url, the provider's variable, the registry's)."""
    try:
        _, _, spec = resolve_model(judge.model, judge.providers)
        return spec.base(judge.base_url) if spec is not None else judge.base_url
    except ConfigError:
        return judge.base_url


async def _list(
    store: BatchStore,
    settings: JudgeSettings | None,
    cancel: bool,
    seams: Seams,
) -> list[dict[str, Any]]:
    client: BatchClient | None = None
    try:
        if settings is not None:
            client = create_batch_client(settings, seams=seams)
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
    audit_shown = False
    for r in rows:
        if r.get("judge") == "audit" and not audit_shown:
            out.append("audit judge (--audit-model):")
            audit_shown = True
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
