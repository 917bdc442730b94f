"""`ctxprec estimate`: what a score run would cost, without calling the judge. Streams the input
like a real run, counts unique calls left after the memo and in-run duplicates, and prices them.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

import polars as pl

from connectors.judges import JudgeStats, create_judge, estimate_tokens
from connectors.judges.base import tokens_for_chars
from connectors.judges.catalog import prices_taken
from connectors.judges.prompts import item_prompt_chars, row_messages
from connectors.sources import SourceInfo, inspect_input
from pipeline.config import Config
from pipeline.planning import BatchPlanner, open_memo
from pipeline.recheck import recheck_cost
from storage.core.constants import STATUS_OK
from storage.memo import judge_prefix
from storage.report import seconds

__all__ = ["DEFAULT_LATENCY_S", "estimate", "render_estimate", "reply_tokens"]

# the reply a judge is asked for, with a typical "one short sentence" reason: an item call answers
# one such verdict, a row call (--mode row) one per item it carries, each with its index
_TYPICAL_REASON = "It gives the fact the answer needs."
DEFAULT_LATENCY_S = {"offline": 0.0}
_HTTP_LATENCY_S = 1.0


def _no_key_needed(name: str) -> str:
    """An estimate makes no call, so it needs no key: a placeholder where none is set (the
    judge's identity, hence the memo keys, never includes the key)."""
    return os.environ.get(name) or "estimate-makes-no-calls"


@lru_cache(maxsize=256)
def reply_tokens(items: int, per_row: bool) -> int:
    """Output tokens of a typical reply to one call carrying `items` items: the JSON the prompt
    asks for (prompts.ITEM_SCHEMA, or ROW_SCHEMA's one verdict per item), counted as inputs are."""
    verdict: dict[str, Any] = {"relevant": False, "reason": _TYPICAL_REASON}
    if per_row:
        reply: dict[str, Any] = {"verdicts": [{"index": i, **verdict} for i in range(items)]}
    else:
        reply = verdict
    return tokens_for_chars(len(json.dumps(reply)))


def _call_tokens(query: str, expected: str | None, items: list[str], per_row: bool) -> list[int]:
    if per_row:
        system, user = row_messages(query, expected, items)
        return [estimate_tokens(system, user)]
    # estimate_tokens(*item_messages(...)) of each item, the row's part framed once
    return [tokens_for_chars(chars) for chars in item_prompt_chars(query, expected, items)]


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
    judge = create_judge(cfg.judge, stats=JudgeStats(), key_source=_no_key_needed)
    prefix = judge_prefix(judge.identity())
    per_row = cfg.judge.mode == "row"
    memo = open_memo(cfg)
    planner = BatchPlanner(cfg, prefix, per_row=per_row, memo=memo, skip_ids=skip_ids)
    seen: set[int] = set()
    f: dict[str, Any] = dict(
        rows=0,
        rows_already_scored=0,
        rows_to_judge=0,
        items=0,
        memo_hits=0,
        duplicates=0,
        calls=0,
        items_asked=0,  # items the calls carry (a row call carries its memoized items too)
        reply_tokens=0,  # output tokens of typical replies to those calls
        input_tokens=0,
        memo_output_tokens=0,
        recheck_calls=0,
    )
    rechecked: set[str] = set()  # --recheck: items already counted
    try:
        for planned in planner.planned(info):
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
                        per_row,
                        f,
                    )
            if cfg.run.recheck > 0:  # --recheck asks a sample of the items again
                calls, tokens = recheck_cost(
                    planned.rows, cfg.run.recheck, cfg.run.recheck_seed, per_row, rechecked
                )
                f["recheck_calls"] += calls
                f["input_tokens"] += tokens
    finally:
        if memo is not None:
            memo.close()
    return _price(f, cfg, judge.model, latency_s)


def _count_row(
    query: str,
    expected: str | None,
    items: list[str],
    keys: list[str],
    found: dict[str, Any],
    seen: set[int],
    per_row: bool,
    f: dict[str, Any],
) -> None:
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
    asked = items if per_row else todo
    tokens = _call_tokens(query, expected, asked, per_row)
    f["calls"] += len(tokens)
    f["input_tokens"] += sum(tokens)
    f["items_asked"] += len(asked)
    f["reply_tokens"] += (
        reply_tokens(len(asked), True) if per_row else len(asked) * reply_tokens(1, False)
    )


def _price(f: dict[str, Any], cfg: Config, model: str, latency_s: float | None) -> dict[str, Any]:
    provider = model.split("/", 1)[0]
    sent = f["calls"] + f["recheck_calls"]  # --recheck's re-asks cost tokens and time too
    out_tokens = 0 if provider == "offline" else _output_tokens(f)
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
        "cost_usd": None if cost is None else round(cost, 6),
        "price_known": price is not None or provider == "offline",
        "price_source": _price_source(cfg, model, price is not None),
        "latency_s_assumed": latency,
        "wall_s": round(bounds[limit], 3),
        "bound_by": limit,
        "concurrency": cfg.limits.concurrency,
        "rpm": cfg.limits.rpm,
        "tpm": cfg.limits.tpm,
    }


def _output_tokens(f: dict[str, Any]) -> int:
    """What the calls will answer: per item as the memo's verdicts of this judge spent (a row
    call's usage is split over its items), else typical replies; --recheck's re-asks as many per
    call as the run's own calls."""
    main: float = (
        f["items_asked"] * f["memo_output_tokens"] / f["memo_hits"]
        if f["memo_hits"] and f["memo_output_tokens"]
        else f["reply_tokens"]
    )
    recheck = f["recheck_calls"] * (main / f["calls"] if f["calls"] else reply_tokens(1, False))
    return round(float(main + recheck))


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
            ),
            f"  judge calls {e['calls']:,} (memo hits {e['memo_hits']:,}, "
            f"in-run duplicates {e['in_run_duplicates']:,}"
            + ")"
            + (f", and {e['recheck_calls']:,} --recheck re-asks" if e.get("recheck_calls") else ""),
            f"  tokens in ~{e['input_tokens']:,}, out ~{e['output_tokens']:,} "
            f"({e['output_tokens_per_call']:.0f}/call)",
            f"  cost {cost}",
            _wall_line(e),
        ]
    )


def _wall_line(e: dict[str, Any]) -> str:
    if e["wall_s"] is None:  # --batch-api (batch_figures.batch_estimate): the provider's queue
        return f"  wall time: {e['batch_api']['wait']}, as the provider's batch queue goes"
    return (
        f"  wall time ~{seconds(e['wall_s'])}, bound by {e['bound_by']} "
        f"(concurrency {e['concurrency']}, rpm {_limit(e['rpm'])}, tpm {_limit(e['tpm'])}, "
        f"latency {e['latency_s_assumed']:g} s/call assumed)"
    )
