"""Phase 2 of a batch-API run (`ctxprec.batchapi.run`): submit the chunk files phase 1 wrote
(`ctxprec.batchapi.scan`), poll with backoff, and collect each batch that ends at once: replies
are read by the judge's own reader and the tolerant parser and written to the memo; retryable
lines (expired, cancelled, 5xx, batches failed as a whole) go into a new batch (bounded rounds)
or online (`--batch-fallback online`); the others fail their items with the provider's cause.
With `--audit-model`, the audit judge's batches are collected side by side (`collect_all`): a
store of their own, the same memo, one deadline.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio

from ctxprec.batchapi.figures import batch_costs
from ctxprec.batchapi.scan import write_missing_lines
from ctxprec.connectors.judges import audit_settings
from ctxprec.connectors.judges.batch.api import create_batch_client
from ctxprec.connectors.judges.batch.client import BatchClient, RemoteBatch
from ctxprec.flow.dispatch import RunCounters
from ctxprec.flow.planning import open_memo
from ctxprec.run.driver import RunPlan
from ctxprec.run.notices import record_memo
from ctxprec.storage.core.errors import (
    BatchesPendingError,
    JudgeError,
    JudgeFatalError,
    JudgeParseError,
    JudgeRetryableError,
)
from ctxprec.storage.core.options import DEFAULT_ROUNDS, BatchOptions
from ctxprec.storage.files import layout
from ctxprec.storage.memo.store import INPUT_TOKENS, OUTPUT_TOKENS, Memo, MemoEntry, judge_prefix
from ctxprec.storage.outdir.batches import BatchStore, ChunkWriter

__all__ = ["DEFAULT_ROUNDS", "BatchCollector", "BatchOptions", "collect_all"]

_MAX_TROUBLES = 20
_log = logging.getLogger("ctxprec.batches")


class BatchCollector:
    """Phase 2 of a batch-API run, after phase 1 wrote the missing calls (`batch_scan`): submit
    each chunk (intent recorded first), poll with backoff, collect each batch that ends into the
    memo, send retryable lines again (bounded rounds) and record what failed; then the figures
    for the summary. With `audit`, the same for the audit judge's calls (`--audit-model`): its
    settings and identity, its sample of rows, its own store (`BatchStore(audit=True)`)."""

    def __init__(
        self, plan: RunPlan, options: BatchOptions, progress: str, *, audit: bool = False
    ) -> None:
        self.plan, self.options, self.audit = plan, options, audit
        self.cfg = plan.cfg
        outdir = plan.runlog.outdir
        assert isinstance(outdir, Path), "score_batch refuses object-store outputs"
        self.outdir = outdir
        settings = audit_settings(self.cfg.judge) if audit else self.cfg.judge
        identity = plan.audit_identity if audit else plan.identity
        assert settings is not None, "no audit judge in this run"
        assert identity is not None, "no audit judge in this run"
        self.settings, self.identity = settings, identity
        self.model = settings.model if audit else plan.spec.judge_model
        self.prefix = judge_prefix(identity)
        self.per_row = plan.spec.per_row
        self.store = BatchStore.load(self.outdir, audit=audit)
        self.client: BatchClient = create_batch_client(settings, seams=plan.seams)
        self.judge = self.client.judge
        self.poll_s = self.cfg.judge.batch_poll_s
        self.poll_max_s = max(self.poll_s, self.cfg.judge.batch_poll_max_s)
        self.progress = _BatchProgress(progress, "audit batches" if audit else "batches")
        self.memo: Memo | None = None
        self.counters = RunCounters()  # what its memo had to say (`record_memo`)
        self._troubles = 0  # polls in a row that failed after their HTTP retries
        self.collected: set[str] = set()  # keys whose answers this run collected (paid now)

    def open_memo(self) -> Memo:
        memo = open_memo(self.cfg)  # (not `or`: an empty Memo is falsy, it has a __len__)
        if memo is not None:
            return memo
        folder = layout.batch_memo(self.outdir)
        way_out = f"remove {folder} (its verdicts are judged again) or write to a new OUTDIR"
        return Memo(folder, way_out=way_out)

    # -- the whole collection
    async def run(self, memo: Memo | None = None) -> dict[str, Any]:
        """Scan, submit, wait and collect; `memo`: one another collector shares (its opener
        closes it), else this one opens its own."""
        await anyio.to_thread.run_sync(self._open_state)
        own = memo is None
        self.memo = await anyio.to_thread.run_sync(self.open_memo) if memo is None else memo
        try:
            live = await anyio.to_thread.run_sync(self.store.live_keys)
            scan = (self.plan, self.client, self.store, self.memo, self.prefix, live, self.audit)
            await anyio.to_thread.run_sync(write_missing_lines, *scan)
            await self._wait()
        finally:
            self.progress.close()
            memo, self.memo = self.memo, None
            if memo is not None and own:
                await anyio.to_thread.run_sync(memo.close)
                record_memo(memo, self.counters)
            with anyio.CancelScope(shield=True):
                await self.client.aclose()
        return self.report()

    def _open_state(self) -> None:
        data = self.store.data
        if data.get("finished"):  # the last run ended: this is a new generation of batches
            data["gen"] = int(data.get("gen", 0)) + 1
            data["failed"], data["finished"] = {}, False
            data["tokens"] = {"input": 0, "output": 0}
        data.setdefault("gen", 0)
        data.setdefault("tokens", {"input": 0, "output": 0})
        s = self.settings
        data["model"] = s.model
        data["settings"] = {
            "model": s.model, "base_url": s.base_url, "api_key_env": s.api_key_env,
            "timeout_s": s.timeout_s, "anthropic_version": s.anthropic_version,
            "providers": [[name, [list(f) for f in flat]] for name, flat in s.providers],
        }  # fmt: skip
        if s.base_url is None:
            # the endpoint the judge resolved (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, else the
            # provider's): `ctxprec batches` asks where the batches are, whatever its environment
            base = self.identity.get("base_url")
            data["settings"]["base_url"] = base if isinstance(base, str) else None
        self.store.save()
        self.store.remove_orphans()

    def finished(self) -> None:
        self.store.data["finished"] = True
        self.store.save()

    # -- phase 2: submit, poll, collect
    async def _wait(self) -> None:
        wait_s = self.options.wait_s
        deadline = None if wait_s is None else time.monotonic() + wait_s
        interval = self.poll_s
        while True:
            for chunk in self.store.live():
                if chunk["stage"] != "created" and chunk["not_before"] <= time.time():
                    await self._submit(chunk)
                    interval = self.poll_s  # a new batch: look at it soon
            for chunk in self.store.live():
                if chunk["stage"] == "created":
                    try:
                        await self._poll(chunk)
                    except JudgeRetryableError as err:  # the provider is briefly unwell
                        self._troubles += 1
                        if self._troubles > _MAX_TROUBLES:
                            raise
                        _log.warning("batch %s: %s; trying again later", chunk["batch_id"], err)
                    else:
                        self._troubles = 0
            self.progress.show(self.store, self._gen_chunks())
            live = self.store.live()
            if not live:
                return
            now = time.time()
            if any(c["stage"] != "created" and c["not_before"] <= now for c in live):
                continue  # retry lines were just written: send them before waiting
            if deadline is not None and time.monotonic() >= deadline:
                raise pending_error(self.outdir, live)
            pause = interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            await anyio.sleep(pause)
            interval = min(interval * 1.5, self.poll_max_s)

    async def _poll(self, chunk: dict[str, Any]) -> None:
        remote = await self.client.poll(chunk["batch_id"])
        seen = (chunk.get("status"), chunk.get("answered"))
        if seen != (remote.status, remote.answered):  # saved only when it changed
            self.store.update(chunk["name"], status=remote.status, answered=remote.answered)
        if remote.ended:
            await self._collect(chunk, remote)

    def _gen_chunks(self) -> list[dict[str, Any]]:
        gen = int(self.store.data.get("gen", 0))
        return [c for c in self.store.chunks.values() if int(c.get("gen", gen)) == gen]

    async def _submit(self, chunk: dict[str, Any]) -> None:
        name, store = chunk["name"], self.store
        if chunk["stage"] == "written":
            store.update(name, stage="intent", intent_at=time.time(), gen=store.data["gen"])
        else:  # a run died after the intent: the batch may exist already
            claimed = {c["batch_id"] for c in store.chunks.values() if c.get("batch_id")}
            found = await self.client.find(
                name, chunk.get("file_id"), float(chunk["intent_at"]), int(chunk["lines"]), claimed
            )
            if found is not None:
                store.update(name, stage="created", batch_id=found, created_at=time.time())
                return

        def on_file(file_id: str) -> None:
            store.update(name, stage="uploaded", file_id=file_id)

        try:
            remote = await self.client.submit(
                name, store.lines_path(name), int(chunk["lines"]), on_file, chunk.get("file_id")
            )
        except JudgeFatalError as err:  # the provider refused the batch itself
            await anyio.to_thread.run_sync(self._fail_chunk, chunk, err)
            return
        store.update(
            name, stage="created", batch_id=remote.id, created_at=time.time(), status=remote.status
        )

    def _fail_chunk(self, chunk: dict[str, Any], err: JudgeError) -> None:
        ids = self.store.read_ids(chunk["name"])
        for keys in ids.values():
            for key in keys:
                self.store.failed[key] = [err.cause, str(err)]
        self.store.update(chunk["name"], stage="collected", status="refused", error=str(err),
                          ended_at=time.time())  # fmt: skip

    async def _collect(self, chunk: dict[str, Any], remote: RemoteBatch) -> None:
        ids = await anyio.to_thread.run_sync(self.store.read_ids, chunk["name"])
        entries: list[tuple[str, MemoEntry]] = []
        errors: dict[str, JudgeError] = {}
        tokens = [0, 0]
        if remote.error is not None:  # the batch failed as a whole
            cause = remote.error.split(":", 1)[0]
            kind = JudgeRetryableError if remote.error_retryable else JudgeFatalError
            errors = {cid: kind(f"batch {remote.id} failed: {remote.error}", cause=cause)
                      for cid in ids}  # fmt: skip
        else:
            seen: set[str] = set()
            try:
                results = [res async for res in self.client.results(remote)]
            except JudgeFatalError as err:  # e.g. the result file is gone: send the lines again
                _log.warning("batch %s: results unavailable (%s); sending again", remote.id, err)
                results = []
            for res in results:
                keys = ids.get(res.custom_id)
                if keys is None or res.custom_id in seen:
                    continue
                seen.add(res.custom_id)
                if res.error is not None:
                    errors[res.custom_id] = res.error
                    continue
                assert res.body is not None
                try:
                    got = self._entries(keys, res.body)
                except JudgeError as err:
                    errors[res.custom_id] = err
                    continue
                entries.extend(got)
                tokens[0] += sum(entry[INPUT_TOKENS] for _, entry in got)
                tokens[1] += sum(entry[OUTPUT_TOKENS] for _, entry in got)
            for cid in ids.keys() - seen:
                errors[cid] = JudgeRetryableError(
                    f"batch {remote.id} ({remote.status}) returned no result for this request",
                    cause="no_result",
                )
        await anyio.to_thread.run_sync(self._settle, chunk, remote, ids, entries, errors, tokens)

    def _entries(self, keys: list[str], body: dict[str, Any]) -> list[tuple[str, MemoEntry]]:
        """Verdicts of one result line, read as the online path reads a reply (refusals,
        filters and cut-off replies raise their JudgeError)."""
        single = len(keys) == 1 and not self.per_row
        replies = self.judge.read_response(body, None if single else len(keys))
        return [
            (k, (r.verdict.relevant, r.verdict.reason, r.input_tokens, r.output_tokens))
            for k, r in zip(keys, replies, strict=True)
        ]

    def _settle(
        self,
        chunk: dict[str, Any],
        remote: RemoteBatch,
        ids: dict[str, list[str]],
        entries: list[tuple[str, MemoEntry]],
        errors: dict[str, JudgeError],
        tokens: list[int],
    ) -> None:
        """Memo first, then retries and failures, then the chunk is collected (one save)."""
        store, name = self.store, chunk["name"]
        if entries:
            assert self.memo is not None
            self.memo.set_many(entries)
            self.collected.update(key for key, _ in entries)
        retry: dict[str, JudgeError] = {}
        adapted: dict[str, dict[str, Any]] = {}
        lines = store.read_lines(name, set(errors))
        round_ = int(chunk["round"])
        for cid, err in errors.items():
            # an unreadable reply is asked afresh once (as online); server-side failures retry
            if isinstance(err, JudgeRetryableError) or (
                isinstance(err, JudgeParseError) and round_ == 1
            ):
                retry[cid] = err
                continue
            line = lines.get(cid)
            body = _body_of(line) if line is not None else None
            changed = self.judge.adapt_payload(err, body) if body is not None else None
            if changed is not None:
                adapted[cid] = changed
                retry[cid] = err
            else:
                for key in ids[cid]:
                    store.failed[key] = [err.cause, str(err)]
        already = any(c.get("parent") == name for c in store.chunks.values())
        if retry and not already and self.options.fallback == "batch":
            if round_ < self.options.rounds:
                delay = self.poll_s * 2**round_ if remote.error is not None else 0.0
                limits = self.client.limits
                writer = ChunkWriter(store, round_ + 1, limits.max_lines, limits.max_bytes,
                                     not_before=time.time() + delay, parent=name)  # fmt: skip
                for cid in retry:
                    line = lines.get(cid)
                    if line is None:
                        continue
                    body = adapted.get(cid) or _body_of(line)
                    writer.add(cid, ids[cid], self.client.line(cid, body))
                writer.close()  # each retry chunk names this one as its parent
            else:
                for cid, err in retry.items():
                    for key in ids[cid]:
                        store.failed[key] = [err.cause, f"{err} (after {round_} batch rounds)"]
        t = store.data.setdefault("tokens", {"input": 0, "output": 0})
        t["input"] += tokens[0]
        t["output"] += tokens[1]
        store.update(
            name,
            stage="collected",
            status=remote.status,
            answered=remote.answered,
            ended_at=time.time(),
            error=remote.error,
            results=len(ids) - len(errors),
            retried=len(retry),
        )
        store.drop_files(name)

    # -- the figures for the summary
    def report(self) -> dict[str, Any]:
        chunks = [c for c in self._gen_chunks() if c.get("batch_id")]
        tokens = self.store.data.get("tokens") or {"input": 0, "output": 0}
        created = [float(c["created_at"]) for c in chunks if c.get("created_at")]
        ended = [float(c["ended_at"]) for c in chunks if c.get("ended_at")]
        out: dict[str, Any] = {
            "provider": self.client.provider,
            "batch_ids": [c["batch_id"] for c in chunks],
            "batches": [
                {k: c.get(k) for k in ("batch_id", "status", "round", "lines", "results")}
                for c in chunks
            ],
            "lines_sent": sum(int(c["lines"]) for c in chunks),
            "rounds": max((int(c["round"]) for c in chunks), default=0),
            "items_failed": len(self.store.failed),
            "took_s": round(max(ended) - min(created), 1) if created and ended else None,
            "input_tokens": int(tokens["input"]),
            "output_tokens": int(tokens["output"]),
        }
        t_in, t_out = out["input_tokens"], out["output_tokens"]
        out.update(batch_costs(self.cfg, self.model, t_in, t_out) or {})
        if self.audit:
            out["model"] = self.model
        return out


def pending_error(outdir: Path, live: Sequence[dict[str, Any]]) -> BatchesPendingError:
    """Exit 6: the `live` chunks (of one judge's store, or both) are still with the provider."""
    answered = sum(int(c.get("answered") or 0) for c in live)
    lines = sum(int(c["lines"]) for c in live)
    ids = ", ".join(str(c["batch_id"] or c["name"]) for c in live[:5])
    noun = "batch" if len(live) == 1 else "batches"
    return BatchesPendingError(
        f"{len(live)} {noun} pending ({answered:,} of {lines:,} lines answered; "
        f"{ids}{', ...' if len(live) > 5 else ''}); run the same command later to "
        f"collect (`ctxprec batches {outdir}` shows them)"
    )


async def collect_all(collectors: Sequence[BatchCollector]) -> list[dict[str, Any]]:
    """Phase 2 of every judge of the run (the first judge's batches, then the audit judge's)
    side by side, on one memo (the first collector's, recorded in its counters): each judge's
    report. When batches are still pending at `--batch-wait`, one BatchesPendingError counts
    both judges' once both have stopped waiting (state saved: the same command collects)."""
    first, *others = collectors
    if not others:
        return [await first.run()]
    memo = await anyio.to_thread.run_sync(first.open_memo)
    reports: dict[int, dict[str, Any]] = {}
    pending: list[BatchCollector] = []

    async def one(i: int, collector: BatchCollector) -> None:
        try:
            reports[i] = await collector.run(memo)
        except BatchesPendingError:
            pending.append(collector)

    try:
        async with anyio.create_task_group() as tg:
            for i, collector in enumerate(collectors):
                tg.start_soon(one, i, collector)
    finally:
        await anyio.to_thread.run_sync(memo.close)
        record_memo(memo, first.counters)
    if pending:
        live = [c for collector in collectors for c in collector.store.live()]
        raise pending_error(first.outdir, live)
    return [reports[i] for i in range(len(collectors))]


def _body_of(line: dict[str, Any]) -> dict[str, Any]:
    body = line.get("body") if "body" in line else line.get("params")
    return dict(body) if isinstance(body, dict) else {}


class _BatchProgress:
    """Lines answered: a tqdm bar on a terminal, a log line every 10 s otherwise."""

    def __init__(self, mode: str, desc: str = "batches", stream: TextIO | None = None) -> None:
        self.desc = desc
        self.stream = stream or sys.stderr
        is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.mode = ("bar" if is_tty else "log") if mode == "auto" else mode
        self._bar: Any = None
        self._last = 0.0
        self._started = time.monotonic()

    def show(self, store: BatchStore, chunks: list[dict[str, Any]]) -> None:
        if self.mode == "off" or not chunks:
            return
        total = sum(int(c["lines"]) for c in chunks)
        done = sum(
            int(c["lines"]) if c["stage"] == "collected" else int(c.get("answered") or 0)
            for c in chunks
        )
        pending = len(store.live())
        if self.mode == "bar":
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit="line", file=self.stream, desc=self.desc)
            self._bar.total = total
            self._bar.n = min(done, total)
            self._bar.set_postfix_str(f"pending batches={pending}", refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._last >= 10.0 or not pending:
            self._last = now
            print(
                f"ctxprec: {self.desc}: {done:,}/{total:,} lines answered, {pending} pending, "
                f"{now - self._started:.0f} s",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
