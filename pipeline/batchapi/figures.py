"""What a batch-API run costs and says: batch prices (half the online price unless `[prices]`
says otherwise), the estimate at those prices, the cost figures of the run summary and the CLI's
lines about them.
"""

from __future__ import annotations

from typing import Any

from ctxprec.config import Config
from ctxprec.run.estimate import per_1k_rows
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.settings import Price

__all__ = [
    "batch_costs",
    "batch_estimate",
    "batch_line",
    "batch_prices",
    "render_batch_estimate",
]


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


def batch_costs(cfg: Config, model: str, t_in: int, t_out: int) -> dict[str, float] | None:
    """What `t_in`/`t_out` tokens cost at batch prices, online, and the saving (USD); None
    when the model has no price."""
    prices = batch_prices(cfg, model)
    if prices is None:
        return None
    online, batch = prices
    cost = (t_in * batch.input_per_mtok + t_out * batch.output_per_mtok) / 1e6
    full = (t_in * online.input_per_mtok + t_out * online.output_per_mtok) / 1e6
    return {
        "cost_usd": round_figure(cost),
        "online_cost_usd": round_figure(full),
        "saving_usd": round_figure(full - cost),
    }


def batch_estimate(est: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """The estimate at batch prices: `cost_usd` becomes the batch cost; `batch_api` holds the
    online cost, the saving and how long the provider may take."""
    out = dict(est)
    info: dict[str, Any] = {"wait": "up to 24 h (the providers' completion window)"}
    t_in, t_out = int(est["input_tokens"]), int(est["output_tokens"])
    costs = batch_costs(cfg, str(est["judge_model"]), t_in, t_out)
    if costs is not None:
        info.update(costs)
        out["cost_usd"] = costs["cost_usd"]
        out["cost_per_1k_rows_usd"] = per_1k_rows(costs["cost_usd"], int(est["rows_to_judge"]))
        rows = int(est["rows"]) + int(est.get("rows_already_scored") or 0)
        out["cost_per_1k_input_rows_usd"] = per_1k_rows(costs["cost_usd"], rows)
    out["batch_api"] = info
    if isinstance(est.get("audit"), dict):  # --audit-model: its calls go through batches too
        audit = dict(est["audit"])
        a_in, a_out = int(audit["input_tokens"]), int(audit["output_tokens"])
        a_costs = batch_costs(cfg, str(audit["judge_model"]), a_in, a_out)
        if a_costs is not None:
            audit.update(a_costs)
        out["audit"] = audit
        first, second = out.get("cost_usd"), audit.get("cost_usd")
        total = None if first is None or second is None else round_figure(first + second)
        out["total_cost_usd"] = total
    # the provider's queue sets the wall time, not ctxprec's limits: no online figure stands here
    out["wall_s"], out["bound_by"] = None, "batch_api"
    return out


def render_batch_estimate(est: dict[str, Any]) -> str:
    b = est["batch_api"]
    if "cost_usd" not in b:
        line = "  batch API: half the online price"
    else:
        line = (
            f"  batch API: ${b['cost_usd']:,.4f} instead of ${b['online_cost_usd']:,.4f} online "
            f"(saving ${b['saving_usd']:,.4f})"
        )
    a = est.get("audit")
    if isinstance(a, dict) and "online_cost_usd" in a:
        line += (
            f"\n  batch API, audit judge: ${a['cost_usd']:,.4f} instead of "
            f"${a['online_cost_usd']:,.4f} online (saving ${a['saving_usd']:,.4f})"
        )
    return line


def batch_line(b: dict[str, Any]) -> str:
    """One line of the CLI's run report about the batches."""
    ids = ", ".join(b.get("batch_ids") or []) or "none"
    took = "—" if b.get("took_s") is None else f"{b['took_s']:.0f} s"
    cost = ""
    if b.get("cost_usd") is not None:
        cost = f", cost ${b['cost_usd']:,.4f} (saving ${b['saving_usd']:,.4f})"
    line = (
        f"  batch API: {b.get('lines_sent', 0)} lines in {len(b.get('batch_ids') or [])} batches "
        f"({ids}), took {took}{cost}"
    )
    if isinstance(b.get("audit"), dict):  # --audit-model: the audit judge's batches
        line += "\n" + batch_line(b["audit"]).replace("batch API:", "batch API, audit judge:", 1)
    return line
