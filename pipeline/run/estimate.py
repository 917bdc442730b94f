"""`ctxprec estimate`: what a score run would cost, without calling the judge. Streams the input
like a real run, counts unique calls left after the memo and in-run duplicates, and prices them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ctxprec.analysis.recheck import recheck_cost
from ctxprec.config import Config
from ctxprec.connectors.judges import JudgeStats, audit_settings, create_judge, estimate_tokens
from ctxprec.connectors.judges.base import tokens_for_chars
from ctxprec.connectors.judges.catalog import prices_taken
from ctxprec.connectors.judges.prompts import (
    TYPICAL_REASON,
    item_prompt_chars,
    row_messages,
    typical_reply,
)
from ctxprec.connectors.sources import SourceInfo, inspect_input
from ctxprec.flow.audit import audited_rows
from ctxprec.flow.planning import ChunkPlanner, PlannedChunk, open_memo
from ctxprec.flow.rows import RowPlan, attach_keys
from ctxprec.storage.core.constants import STATUS_OK
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.memo.store import Memo, judge_prefix
from ctxprec.storage.report.summary import seconds

__all__ = [
    "DEFAULT_LATENCY_S",
    "estimate",
    "per_1k_rows",
    "render_estimate",
    "reply_tokens",
]

DEFAULT_LATENCY_S = {"offline": 0.0}
_HTTP_LATENCY_S = 1.0


def _no_key_needed(name: str) -> str:
    """An estimate makes no call, so it needs no key: a placeholder where none is set (the
    judge's identity, hence the memo keys, never includes the key)."""
    return os.environ.get(name) or "estimate-makes-no-calls"


_NO_CALLS = Seams(keys=_no_key_needed)  # the seams of the estimate's judges (built, never used)


def _call_tokens(
    query: str, expected: str | None, items: list[str], per_row: bool, verdict_only: bool
) -> list[int]:
    if per_row:
        system, user = row_messages(query, expected, items, verdict_only)
        return [estimate_tokens(system, user)]
    # estimate_tokens(*item_messages(...)) of each item, the row's part framed once
    chars = item_prompt_chars(query, expected, items, verdict_only)
    return [tokens_for_chars(c) for c in chars]


def reply_tokens(n_items: int, per_row: bool, verdict_only: bool) -> int:
    """Output tokens of the replies to `n_items` items, from the reply schema (a typical reason
    where it has one): one call of `n_items` (per row), or `n_items` calls of one."""
    if per_row:
        return estimate_tokens(typical_reply(n_items, verdict_only))
    return n_items * estimate_tokens(typical_reply(None, verdict_only))


def per_1k_rows(cost_usd: float | None, rows: int) -> float | None:
    """USD per 1,000 rows that need the judge; None without a price or such rows."""
    return None if cost_usd is None or not rows else round_figure(cost_usd / rows * 1000)


def estimate(
    input: str,
    cfg: Config,
    *,
    latency_s: float | None = None,
    skip_ids: pl.Series | None = None,
    info: SourceInfo | None = None,
) -> dict[str, Any]:
    """Figures for a run of `cfg` over `input`; reads the memo, never writes or calls. Rows
    whose id is in `skip_ids` (already scored in the target folder) are counted apart. `info`:
    the input as a run already inspected it (None: inspected here)."""
    if info is None:
        info = inspect_input(input, cfg.columns, cfg.storage)
    judge = create_judge(cfg.judge, stats=JudgeStats(), seams=_NO_CALLS)
    prefix = judge_prefix(judge.identity())
    per_row = cfg.judge.mode == "row"
    memo = open_memo(cfg)
    planner = ChunkPlanner(cfg, prefix, per_row=per_row, memo=memo, skip_ids=skip_ids)
    seen: set[int] = set()
    # items_sent: items the calls (and re-asks) carry, what replies are counted by;
    # schema_output_tokens: their replies' tokens as the reply schema gives them
    f = _fresh_figures()
    rechecked: set[str] = set()  # --recheck: items already counted
    audit = _AuditCount.of(cfg, memo)
    try:
        for planned in planner.planned(info):
            if audit is not None:  # --audit-model: the sampled rows, by the audit judge
                audit.count(planned, per_row, cfg.judge.verdict_only)
            f["rows_already_scored"] += planned.dropped
            f["rows"] += len(planned.rows)
            for plan in planned.rows:
                if plan.status == STATUS_OK:
                    _count_row(
                        plan.query or "",
                        plan.expected,
                        plan.items,
                        plan.keys,
                        planned.found,
                        seen,
                        (per_row, cfg.judge.verdict_only),
                        f,
                    )
            if cfg.run.recheck > 0:  # --recheck asks a sample of the items again
                calls, tokens, items = recheck_cost(
                    planned.rows, cfg.run.recheck, cfg.run.recheck_seed, per_row, rechecked,
                    cfg.judge.verdict_only,
                )  # fmt: skip
                f["recheck_calls"] += calls
                f["input_tokens"] += tokens
                f["items_sent"] += sum(items)
                f["schema_output_tokens"] += sum(
                    reply_tokens(n, per_row, cfg.judge.verdict_only) for n in items
                )
    finally:
        if memo is not None:
            memo.close()
    figures = _price(f, cfg, judge.model, latency_s)
    if info.duplicates is not None:  # --duplicate-ids keep-*: rows not scored, not counted
        figures["rows_dropped_as_duplicates"] = info.duplicates.rows
    if audit is not None:
        figures |= audit.figures(cfg, latency_s, figures["cost_usd"])
    return figures


def _fresh_figures() -> dict[str, Any]:
    return dict.fromkeys(
        ("rows", "rows_already_scored", "rows_to_judge", "items", "memo_hits", "duplicates",
         "calls", "input_tokens", "memo_output_tokens", "recheck_calls", "items_sent",
         "schema_output_tokens"), 0,
    )  # fmt: skip


@dataclass
class _AuditCount:
    """The audit judge's calls (`--audit-model`): every item of the sampled rows that its memo
    entries do not hold, priced at the audit model's price."""

    model: str
    prefix: bytes
    fraction: float
    seed: int
    memo: Memo | None
    f: dict[str, Any] = field(default_factory=_fresh_figures)
    seen: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, cfg: Config, memo: Memo | None) -> _AuditCount | None:
        settings = audit_settings(cfg.judge)
        if settings is None:
            return None
        judge = create_judge(settings, stats=JudgeStats(), seams=_NO_CALLS)
        j = cfg.judge
        return cls(settings.model, judge_prefix(judge.identity()), j.audit_fraction, j.audit_seed,
                   memo)  # fmt: skip

    def count(self, planned: PlannedChunk, per_row: bool, verdict_only: bool) -> None:
        ids = planned.frame.get_column("id").to_list() if planned.rows else []
        picked = [
            planned.rows[i] for i in audited_rows(ids, planned.rows, self.fraction, self.seed)
        ]
        plans = [RowPlan(p.query, p.expected, list(p.items), p.status) for p in picked]
        keys = attach_keys(plans, self.prefix, per_row, verdict_only)
        found = self.memo.get_many(keys) if self.memo is not None and keys else {}
        self.f["rows"] += len(plans)
        for plan in plans:
            if plan.status == STATUS_OK:
                _count_row(plan.query or "", plan.expected, plan.items, plan.keys, found,
                           self.seen, (per_row, verdict_only), self.f)  # fmt: skip

    def figures(self, cfg: Config, latency_s: float | None, cost: float | None) -> dict[str, Any]:
        """`audit_calls` and the `audit` block beside the first judge's figures; `total_cost_usd`
        is both judges' (None unless both prices are known)."""
        a = _price(self.f, cfg, self.model, latency_s)
        keep = ("judge_model", "rows", "rows_to_judge", "context_items", "memo_hits",
                "in_run_duplicates", "calls", "input_tokens", "output_tokens", "cost_usd",
                "price_known", "price_source")  # fmt: skip
        block = {k: a[k] for k in keep} | {"fraction": self.fraction, "seed": self.seed}
        total = (
            None if cost is None or a["cost_usd"] is None else round_figure(cost + a["cost_usd"])
        )
        return {"audit_calls": a["calls"], "audit": block, "total_cost_usd": total}


def _count_row(
    query: str,
    expected: str | None,
    items: list[str],
    keys: list[str],
    found: dict[str, Any],
    seen: set[int],
    mode: tuple[bool, bool],
    f: dict[str, Any],
) -> None:
    per_row, verdict_only = mode
    f["items"] += len(items)
    todo = []
    for item, key in zip(items, keys, strict=True):
        if key in found:
            f["memo_hits"] += 1
            f["memo_output_tokens"] += int(found[key][3])
            continue
        short = int(key[3:19], 16)
        if short in seen:
            f["duplicates"] += 1
            continue
        seen.add(short)
        todo.append(item)
    if not todo:
        return
    f["rows_to_judge"] += 1
    sent = items if per_row else todo
    tokens = _call_tokens(query, expected, sent, per_row, verdict_only)
    f["calls"] += len(tokens)
    f["input_tokens"] += sum(tokens)
    f["items_sent"] += len(sent)
    f["schema_output_tokens"] += reply_tokens(len(sent), per_row, verdict_only)


def _price(f: dict[str, Any], cfg: Config, model: str, latency_s: float | None) -> dict[str, Any]:
    provider = model.split("/", 1)[0]
    # output tokens an item: what the memo's replies (same prompt version, so the same reply
    # schema) cost, else what the reply schema gives
    known = f["memo_hits"] and f["memo_output_tokens"]  # (the offline judge's verdicts: none)
    per_item_out = f["memo_output_tokens"] / f["memo_hits"] if known else None
    sent = f["calls"] + f["recheck_calls"]  # --recheck's re-asks cost tokens and time too
    out_tokens = (
        f["schema_output_tokens"] if per_item_out is None else round(f["items_sent"] * per_item_out)
    )
    out_tokens = 0 if provider == "offline" else out_tokens
    in_tokens = 0 if provider == "offline" else f["input_tokens"]
    price = cfg.price_for(model)
    cost = (
        None
        if price is None
        else (in_tokens * price.input_per_mtok + out_tokens * price.output_per_mtok) / 1e6
    )
    if provider == "offline":
        cost = 0.0
    latency = (
        latency_s if latency_s is not None else DEFAULT_LATENCY_S.get(provider, _HTTP_LATENCY_S)
    )
    bounds = {"concurrency": sent * latency / cfg.limits.concurrency}
    if cfg.limits.rpm:
        bounds["rpm"] = sent / cfg.limits.rpm * 60.0
    if cfg.limits.tpm:
        bounds["tpm"] = (in_tokens + out_tokens) / cfg.limits.tpm * 60.0
    limit = max(bounds, key=lambda k: bounds[k])
    return {
        "judge_model": model,
        "rows": f["rows"],
        "rows_to_judge": f["rows_to_judge"],
        "rows_already_scored": f["rows_already_scored"],
        "context_items": f["items"],
        "memo_hits": f["memo_hits"],
        "in_run_duplicates": f["duplicates"],
        "calls": f["calls"],
        "recheck_calls": f["recheck_calls"],  # --recheck's re-asks, beside `calls`
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "output_tokens_per_call": round(out_tokens / sent, 1) if sent else 0,
        "output_tokens_from": "memo" if per_item_out is not None else "reply schema",
        "output_tokens_basis": _output_basis(per_item_out, f["memo_hits"], cfg.judge.verdict_only),
        "verdict_only": cfg.judge.verdict_only,
        "cost_usd": None if cost is None else round_figure(cost),
        "cost_per_1k_rows_usd": per_1k_rows(cost, f["rows_to_judge"]),  # rows needing the judge
        "cost_per_1k_input_rows_usd": per_1k_rows(cost, f["rows"] + f["rows_already_scored"]),
        "price_known": price is not None or provider == "offline",
        "price_source": _price_source(cfg, model, price is not None),
        "latency_s_assumed": latency,
        "wall_s": round(bounds[limit], 3),
        "bound_by": limit,
        "concurrency": cfg.limits.concurrency,
        "rpm": cfg.limits.rpm,
        "tpm": cfg.limits.tpm,
    }


def _output_basis(per_item: float | None, hits: int, verdict_only: bool) -> str:
    """How the output tokens were estimated, in words (`estimate` says it, the JSON keeps it)."""
    if per_item is not None:
        return (f"measured: {per_item:.1f} tokens an item, the mean of the {hits:,} replies of "
                "this prompt version the memo holds")  # fmt: skip
    if verdict_only:
        return "the reply schema's JSON with a verdict and no reason (verdict-only)"
    return (f"the reply schema's JSON with a typical one-sentence reason ({len(TYPICAL_REASON)} "
            "characters, about 29 tokens): judges write 20 to 40 tokens a reason")  # fmt: skip


def _price_source(cfg: Config, model: str, known: bool) -> str | None:
    """Where the price came from: the config's [prices], or the provider registry (dated)."""
    if not known:
        return None
    if model in cfg.prices:
        return "[prices] of the config"
    return f"provider registry, prices of {prices_taken()}"


def _limit(value: float | None) -> str:
    """A limit as people write it: 2,000,000 (never 2e+06), 1.5."""
    if value is None:
        return "no limit"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,}"


def _per_1k_line(e: dict[str, Any]) -> list[str]:
    """The cost per 1,000 rows, both ways: of the rows that need the judge (those the memo,
    in-run duplicates or the output folder do not answer), and of the input's rows."""
    per_1k = e.get("cost_per_1k_rows_usd")
    if per_1k is None:
        return []
    mode = "verdict-only" if e.get("verdict_only") else "with per-item reasons"
    line = f"  ≈ ${per_1k:,.4f} per 1k rows that need the judge ({mode})"
    per_input = e.get("cost_per_1k_input_rows_usd")
    if per_input is not None:
        line += f", ≈ ${per_input:,.4f} per 1k input rows"
    return [line]


def render_estimate(e: dict[str, Any]) -> str:
    cost = (
        f'no price known for {e["judge_model"]} (add a [prices."{e["judge_model"]}"] entry '
        "with input_per_mtok and output_per_mtok to a config)"
        if e["cost_usd"] is None
        else f"${e['cost_usd']:,.4f}" + (f" ({e['price_source']})" if e.get("price_source") else "")
    )
    return "\n".join(
        [
            f"ctxprec estimate for {e['judge_model']}",
            f"  rows {e['rows']:,} ({e['rows_to_judge']:,} need the judge), "
            f"context items {e['context_items']:,}"
            + (
                f"; {e['rows_already_scored']:,} rows already scored in the output folder "
                "are not counted"
                if e.get("rows_already_scored")
                else ""
            )
            + (
                f"; {e['rows_dropped_as_duplicates']:,} rows repeating an id are dropped"
                if e.get("rows_dropped_as_duplicates")
                else ""
            ),
            f"  judge calls {e['calls']:,} (memo hits {e['memo_hits']:,}, "
            f"in-run duplicates {e['in_run_duplicates']:,}"
            + ")"
            + (f", and {e['recheck_calls']:,} --recheck re-asks" if e.get("recheck_calls") else ""),
            f"  tokens in ~{e['input_tokens']:,}, out ~{e['output_tokens']:,} "
            f"({e['output_tokens_per_call']:.0f}/call)",
            *(
                [f"  output tokens: {e['output_tokens_basis']}"]
                if e.get("output_tokens_basis")
                else []
            ),
            f"  cost {cost}",
            *_per_1k_line(e),
            *_audit_line(e),
            _wall_line(e),
        ]
    )


def _audit_line(e: dict[str, Any]) -> list[str]:
    a = e.get("audit")
    if not a:
        return []
    cost = "no price known" if a["cost_usd"] is None else f"${a['cost_usd']:,.4f}"
    total = "" if e.get("total_cost_usd") is None else f"; both judges ${e['total_cost_usd']:,.4f}"
    return [
        f"  audit judge {a['judge_model']}: {a['rows']:,} rows sampled ({a['fraction']:g}, seed "
        f"{a['seed']}), {a['calls']:,} calls (memo hits {a['memo_hits']:,}), tokens in "
        f"~{a['input_tokens']:,}, out ~{a['output_tokens']:,}, cost {cost}{total}"
    ]


def _wall_line(e: dict[str, Any]) -> str:
    if e["wall_s"] is None:  # --batch-api (batch_figures.batch_estimate): the provider's queue
        return f"  wall time: {e['batch_api']['wait']}, as the provider's batch queue goes"
    return (
        f"  wall time ~{seconds(e['wall_s'])}, bound by {e['bound_by']} "
        f"(concurrency {e['concurrency']}, rpm {_limit(e['rpm'])}, tpm {_limit(e['tpm'])}, "
        f"latency {e['latency_s_assumed']:g} s/call assumed)"
    )
