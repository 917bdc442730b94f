"""`ctxprec score --batch-api`: the judge's calls go through the provider's batch API (half the
price, answers within 24 h), then the ordinary pipeline scores the rows from the memo.

1. Scan: stream the input like a run, build the memo key of every item, and write a batch line
   for every unique call the memo does not hold and no live batch already carries (chunk files in
   OUTDIR/_ctxprec/batches/, within the provider's limits).
2. Submit and wait: record the intent, upload/create, record the batch id; poll with backoff.
   Each batch that ends is collected at once: replies are read by the judge's own reader and the
   tolerant parser and written to the memo; retryable lines (expired, cancelled, 5xx, batches
   failed as a whole) go into a new batch (bounded rounds) or online (`--batch-fallback
   online`); the others fail their items with the provider's cause.
3. Score: the ordinary stage runs with a judge that answers no verdict online (unless the
   fallback says so), so every verdict comes from the memo; parts, summary, sinks and incremental
   runs behave as without batches. With `reason = "llm"` the stage asks the online judge for each
   scored row's reason, as a run without batches does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio

from connectors.judges import ItemRequest, Judge, JudgeReply, JudgeStats, create_judge, prompts
from connectors.judges.base import Gate
from connectors.judges.batch_api import check_batch_support, create_batch_client
from connectors.judges.batch_client import BatchClient, RemoteBatch, custom_id_for
from connectors.judges.registry import resolve_model
from pipeline.config import Config, parse_duration
from pipeline.dispatch import RunCounters
from pipeline.driver import LocalRun, RunOptions, RunPlan, RunResult, local_run, run_blocking
from pipeline.planning import BatchPlanner, open_memo
from pipeline.stage import run_stage
from storage import layout
from storage.batches import BatchStore, ChunkWriter
from storage.core.constants import STATUS_OK
from storage.core.errors import (
    BatchesPendingError,
    ConfigError,
    JudgeError,
    JudgeFatalError,
    JudgeParseError,
    JudgeRetryableError,
)
from storage.core.settings import JudgeSettings, Price
from storage.memo import INPUT_TOKENS, OUTPUT_TOKENS, Memo, MemoEntry, judge_prefix, memo_key
from storage.objpath import ObjPath, OutPath, out_path

__all__ = [
    "BatchOptions",
    "batch_prices",
    "list_batches",
    "parse_duration",
    "run_batch_score",
    "score_batch",
]

DEFAULT_ROUNDS = 8
_MAX_TROUBLES = 20
_log = logging.getLogger("ctxprec.batches")


@dataclass(frozen=True, slots=True)
class BatchOptions:
    wait_s: float | None = None  # None: wait until every batch has ended
    fallback: str = "batch"  # "batch": retry in new batches; "online": retry online
    rounds: int = DEFAULT_ROUNDS


def batch_prices(cfg: Config, model: str) -> tuple[Price, Price] | None:
    """(online price, batch price) per million tokens; the batch price defaults to half."""
    price = cfg.price_for(model)
    if price is None:
        return None
    b_in = price.batch_input_per_mtok
    b_out = price.batch_output_per_mtok
    batch = Price(
        price.input_per_mtok / 2 if b_in is None else b_in,
        price.output_per_mtok / 2 if b_out is None else b_out,
    )
    return price, batch


def score_batch(
    input: str | Path,
    outdir: str | Path,
    config: Config | None = None,
    options: RunOptions | None = None,
    *,
    batch: BatchOptions | None = None,
) -> RunResult:
    """Synchronous entry point of a batch-API run (what `ctxprec score --batch-api` runs)."""
    cfg, how, opts = config or Config(), options or RunOptions(), batch or BatchOptions()
    if isinstance(out_path(outdir), ObjPath):
        raise ConfigError(
            f"--batch-api keeps its request files in OUTDIR on local disk; {outdir} is an "
            "object store: score into a local folder with --batch-api, or drop --batch-api"
        )
    return run_blocking(lambda: run_batch_score(str(input), out_path(outdir), cfg, opts, how))


def check_batch_provider(cfg: Config) -> None:
    check_batch_support(cfg.judge)  # the provider registry says which have a batch API


async def run_batch_score(
    input: str,
    outdir: OutPath,
    cfg: Config,
    options: BatchOptions,
    run_options: RunOptions,
) -> RunResult:
    check_batch_provider(cfg)
    async with local_run(input, outdir, cfg, run_options) as run:
        return await _batch_run(run, cfg, options, run_options.progress)


async def _batch_run(run: LocalRun, cfg: Config, options: BatchOptions, progress: str) -> RunResult:
    plan = run.plan
    est = plan.runlog.load_json(layout.estimate(plan.runlog.outdir))
    if est is not None and "batch_api" not in est:  # estimate vs actual, both at batch prices
        plan.runlog.save_json(layout.estimate(plan.runlog.outdir), batch_estimate(est, cfg))
    collector = _Collector(plan, options, progress)
    report = await collector.run()
    counters = RunCounters(rows_done=plan.rows_skipped, rows_skipped=plan.rows_skipped)
    failed = dict(collector.store.failed)
    online = options.fallback == "online"

    def judge_factory(gate: Gate, stats: JudgeStats) -> Judge:
        inner = create_judge(cfg.judge, gate=gate, stats=stats)
        return _ResultJudge(inner, failed, collector.prefix, online)

    result = await run_stage(
        plan,
        counters=counters,
        progress=progress,
        judge_factory=judge_factory,
        open_memo=collector.open_memo,
    )
    result.extra["batch_api"] = report
    # the summary prices this run's tokens (the batches' own) at batch prices
    result.stats.input_tokens += int(report["input_tokens"])
    result.stats.output_tokens += int(report["output_tokens"])
    prices = batch_prices(cfg, plan.spec.judge_model)
    if prices is not None:
        plan.cfg = dataclasses.replace(cfg, prices={**cfg.prices, plan.spec.judge_model: prices[1]})
    finished = await run.finish(result)
    await anyio.to_thread.run_sync(collector.finished)
    return finished


# ---------------------------------------------------------------- phase 3: the stage's judge


class _ResultJudge:
    """The stage's judge: every verdict should be in the memo already. An item the batches
    failed fails with the provider's cause; any other verdict call goes online only with
    `--batch-fallback online`, else it fails (never a silent online call). A row's reason
    (`--reason llm`) needs its verdicts first, so it is asked of the online judge."""

    def __init__(
        self, inner: Judge, failed: dict[str, list[str]], prefix: bytes, online: bool
    ) -> None:
        self.inner, self.failed, self.prefix, self.online = inner, failed, prefix, online
        self.model = inner.model

    def identity(self) -> dict[str, object]:
        return self.inner.identity()

    def _check(self, keys: list[str]) -> None:
        for key in keys:
            if key in self.failed:
                cause, message = self.failed[key]
                raise JudgeFatalError(message, cause=cause)
        if not self.online:
            raise JudgeFatalError(
                "no answer from the provider's batch for this item; run the same command again",
                cause="batch_missing",
            )

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        version = prompts.prompt_version_for(request.expected, False)
        key = memo_key(self.prefix, version, request.query, request.expected, request.item)
        self._check([key])
        return await self.inner.judge_item(request)

    async def judge_row(self, query: str, expected: str | None, items: Any) -> list[JudgeReply]:
        version = prompts.prompt_version_for(expected, True)
        self._check([memo_key(self.prefix, version, query, expected, it) for it in items])
        return await self.inner.judge_row(query, expected, items)

    async def write_reason(self, prompt: str) -> str:
        return await self.inner.write_reason(prompt)

    async def aclose(self) -> None:
        await self.inner.aclose()


# ---------------------------------------------------------------- phases 1 and 2


class _Collector:
    def __init__(self, plan: RunPlan, options: BatchOptions, progress: str) -> None:
        self.plan, self.options = plan, options
        self.cfg = plan.cfg
        outdir = plan.runlog.outdir
        assert isinstance(outdir, Path), "score_batch refuses object-store outputs"
        self.outdir = outdir
        self.prefix = judge_prefix(plan.identity)
        self.per_row = plan.spec.per_row
        self.store = BatchStore.load(self.outdir)
        self.client: BatchClient = create_batch_client(self.cfg.judge)
        self.judge = self.client.judge
        self.poll_s = self.cfg.judge.batch_poll_s
        self.poll_max_s = max(self.poll_s, self.cfg.judge.batch_poll_max_s)
        self.progress = _BatchProgress(progress)
        self.memo: Memo | None = None
        self._troubles = 0  # polls in a row that failed after their HTTP retries

    def open_memo(self) -> Memo:
        memo = open_memo(self.cfg)  # (not `or`: an empty Memo is falsy, it has a __len__)
        return memo if memo is not None else Memo(layout.batch_memo(self.outdir))

    # -- the whole collection
    async def run(self) -> dict[str, Any]:
        await anyio.to_thread.run_sync(self._open_state)
        self.memo = await anyio.to_thread.run_sync(self.open_memo)
        try:
            live = await anyio.to_thread.run_sync(self.store.live_keys)
            await anyio.to_thread.run_sync(self._scan, live)
            await self._wait()
        finally:
            self.progress.close()
            memo, self.memo = self.memo, None
            if memo is not None:
                await anyio.to_thread.run_sync(memo.close)
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
        s = self.cfg.judge
        data["model"] = s.model
        data["settings"] = {
            "model": s.model, "base_url": s.base_url, "api_key_env": s.api_key_env,
            "timeout_s": s.timeout_s, "anthropic_version": s.anthropic_version,
            "providers": [[name, [list(f) for f in flat]] for name, flat in s.providers],
        }  # fmt: skip
        spec = resolve_model(s.model, s.providers)[2]
        if s.base_url is None and spec is not None and spec.base_url_env:
            # remember the endpoint the environment gave (OPENAI_BASE_URL, ANTHROPIC_BASE_URL)
            data["settings"]["base_url"] = os.environ.get(spec.base_url_env) or None
        self.store.save()
        self.store.remove_orphans()

    def finished(self) -> None:
        self.store.data["finished"] = True
        self.store.save()

    # -- phase 1: which calls are missing
    def _rows(self) -> Iterator[Any]:
        plan = self.plan
        assert self.memo is not None
        planner = BatchPlanner(
            self.cfg, self.prefix, per_row=self.per_row, memo=self.memo, skip_ids=plan.skip_ids
        )
        for planned in planner.planned(plan.info, skip=plan.skip_parts):
            yield planned.rows, planned.found

    def _scan(self, live: set[str]) -> None:
        limits = self.client.limits
        writer = ChunkWriter(self.store, 1, limits.max_lines, limits.max_bytes)
        skip = set(live) | set(self.store.failed)
        for rows, found in self._rows():
            for row in rows:
                if row.status != STATUS_OK:
                    continue
                todo = [k for k in row.keys if k not in found and k not in skip]
                if not todo:
                    continue
                assert row.query is not None
                if self.per_row:
                    body = self._row_body(row.query, row.expected, row.items)
                    cid = custom_id_for(row.keys)
                    writer.add(cid, row.keys, self.client.line(cid, body))
                    skip.update(row.keys)
                    continue
                for key, item in zip(row.keys, row.items, strict=True):
                    if key in found or key in skip:
                        continue
                    skip.add(key)
                    body = self._item_body(ItemRequest(row.query, row.expected, item))
                    cid = custom_id_for([key])
                    writer.add(cid, [key], self.client.line(cid, body))
        writer.close()

    def _item_body(self, request: ItemRequest) -> dict[str, Any]:
        return self.judge.build_payload(request)  # the online path's body, its shape included

    def _row_body(self, query: str, expected: str | None, items: list[str]) -> dict[str, Any]:
        return self.judge.build_payload(row=(query, expected, items))

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
                answered = sum(int(c.get("answered") or 0) for c in live)
                lines = sum(int(c["lines"]) for c in live)
                ids = ", ".join(str(c["batch_id"] or c["name"]) for c in live[:5])
                noun = "batch" if len(live) == 1 else "batches"
                raise BatchesPendingError(
                    f"{len(live)} {noun} pending ({answered:,} of {lines:,} lines answered; "
                    f"{ids}{', ...' if len(live) > 5 else ''}); run the same command later to "
                    f"collect (`ctxprec batches {self.outdir}` shows them)"
                )
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
        prices = batch_prices(self.cfg, self.plan.spec.judge_model)
        if prices is not None:
            online, batch = prices
            t_in, t_out = out["input_tokens"], out["output_tokens"]
            cost = (t_in * batch.input_per_mtok + t_out * batch.output_per_mtok) / 1e6
            full = (t_in * online.input_per_mtok + t_out * online.output_per_mtok) / 1e6
            out.update(
                cost_usd=round(cost, 6),
                online_cost_usd=round(full, 6),
                saving_usd=round(full - cost, 6),
            )
        return out


def _body_of(line: dict[str, Any]) -> dict[str, Any]:
    body = line.get("body") if "body" in line else line.get("params")
    return dict(body) if isinstance(body, dict) else {}


class _BatchProgress:
    """Lines answered: a tqdm bar on a terminal, a log line every 10 s otherwise."""

    def __init__(self, mode: str, stream: TextIO | None = None) -> None:
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

                self._bar = tqdm(total=total, unit="line", file=self.stream, desc="batches")
            self._bar.total = total
            self._bar.n = min(done, total)
            self._bar.set_postfix_str(f"pending batches={pending}", refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._last >= 10.0 or not pending:
            self._last = now
            print(
                f"ctxprec: batches: {done:,}/{total:,} lines answered, {pending} pending, "
                f"{now - self._started:.0f} s",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# ---------------------------------------------------------------- `ctxprec batches OUTDIR`


def list_batches(outdir: OutPath, *, cancel: bool = False) -> list[dict[str, Any]]:
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
    return anyio.run(_list, store, cancel)


async def _list(store: BatchStore, cancel: bool) -> list[dict[str, Any]]:
    saved = dict(store.data.get("settings") or {})
    saved["providers"] = tuple(
        (str(name), tuple((str(k), str(v)) for k, v in flat))
        for name, flat in saved.get("providers") or ()
    )
    settings = JudgeSettings(**saved)
    client: BatchClient | None = None
    try:
        client = create_batch_client(settings)
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


# ---------------------------------------------------------------- cost: estimate and summary


def batch_estimate(est: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """The estimate at batch prices: `cost_usd` becomes the batch cost; `batch_api` holds the
    online cost, the saving and how long the provider may take."""
    out = dict(est)
    prices = batch_prices(cfg, str(est["judge_model"]))
    info: dict[str, Any] = {"wait": "up to 24 h (the providers' completion window)"}
    if prices is not None:
        online, batch = prices
        t_in, t_out = int(est["input_tokens"]), int(est["output_tokens"])
        cost = (t_in * batch.input_per_mtok + t_out * batch.output_per_mtok) / 1e6
        full = (t_in * online.input_per_mtok + t_out * online.output_per_mtok) / 1e6
        info.update(
            cost_usd=round(cost, 6),
            online_cost_usd=round(full, 6),
            saving_usd=round(full - cost, 6),
        )
        out["cost_usd"] = round(cost, 6)
    out["batch_api"] = info
    return out


def render_batch_estimate(est: dict[str, Any]) -> str:
    b = est["batch_api"]
    if "cost_usd" not in b:
        return f"  batch API: half the online price; answers take {b['wait']}"
    return (
        f"  batch API: ${b['cost_usd']:,.4f} instead of ${b['online_cost_usd']:,.4f} online "
        f"(saving ${b['saving_usd']:,.4f}); answers take {b['wait']}"
    )


def batch_line(b: dict[str, Any]) -> str:
    """One line of the CLI's run report about the batches."""
    ids = ", ".join(b.get("batch_ids") or []) or "none"
    took = "—" if b.get("took_s") is None else f"{b['took_s']:.0f} s"
    cost = ""
    if b.get("cost_usd") is not None:
        cost = f", cost ${b['cost_usd']:,.4f} (saving ${b['saving_usd']:,.4f})"
    return (
        f"  batch API: {b.get('lines_sent', 0)} lines in {len(b.get('batch_ids') or [])} batches "
        f"({ids}), took {took}{cost}"
    )
