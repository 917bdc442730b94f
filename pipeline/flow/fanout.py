"""Where each item's verdict comes from, for one batch of checked rows: the memo, a call this run
already made or has in flight (de-duplication), or a new judge call handed to the dispatcher
(`dispatch.py`, which makes the calls); the rows complete as their verdicts arrive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from ctxprec.connectors.judges.base import ItemRequest
from ctxprec.flow.dispatch import PAID, Dispatcher, ItemOutcome, RunCounters
from ctxprec.flow.rows import RowPlan
from ctxprec.storage.core.constants import STATUS_FAILED, STATUS_OK
from ctxprec.storage.memo.store import INPUT_TOKENS, OUTPUT_TOKENS, MemoEntry

__all__ = ["resolve_items"]


async def resolve_items(
    plans: Sequence[RowPlan], found: dict[str, MemoEntry], dispatcher: Dispatcher, per_row: bool
) -> None:
    """Fill entries from the memo, from this run's earlier calls, or from new judge calls.

    Submitting and collecting run side by side, so rows complete (and show in the progress bar)
    while later rows of the batch are still being sent out.
    """
    if dispatcher.decider is not None and not per_row:
        await _resolve_inline(plans, found, dispatcher)
        return
    send, recv = anyio.create_memory_object_stream[RowPlan](math.inf)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_collect, recv, dispatcher.counters)
        async with send:
            for plan in plans:
                await _lookup(plan, found, dispatcher, per_row)
                send.send_nowait(plan)


def _all_found(plan: RowPlan, found: dict[str, MemoEntry], dispatcher: Dispatcher) -> bool:
    """The common case of a re-run: every item of the row is in the memo. Fills the row at once
    (the tokens of a verdict go to the first row that uses it, as its verdict's cost, paid by
    an earlier run; a verdict without tokens needs no such bookkeeping)."""
    entries = [found.get(key) for key in plan.keys]
    if None in entries:
        return False
    plan.entries = entries
    dispatcher.counters.memo_hits += len(entries)
    for i, entry in enumerate(entries):
        if entry[INPUT_TOKENS] or entry[OUTPUT_TOKENS]:  # type: ignore[index]
            plan.paid[i] = dispatcher.carry(plan.keys[i])
    return True


async def _resolve_inline(
    plans: Sequence[RowPlan], found: dict[str, MemoEntry], dispatcher: Dispatcher
) -> None:
    """A synchronous judge (offline): every row resolved in order, its misses judged on the
    spot, and the batch's new verdicts sent to the memo writer in one message."""
    counters = dispatcher.counters
    fresh: list[tuple[str, MemoEntry]] = []
    for plan in plans:
        counters.rows_judged += 1
        if plan.status != STATUS_OK:
            continue
        counters.items += len(plan.items)
        if _all_found(plan, found, dispatcher):
            continue
        assert plan.query is not None
        for i, key in enumerate(plan.keys):
            if _from_memo(plan, i, key, found, dispatcher):
                continue
            known = dispatcher.known(key)  # nothing is ever in flight with a synchronous judge
            if isinstance(known, tuple):
                counters.dedup_hits += 1
                plan.entries[i] = known
                continue
            plan.paid[i] = PAID
            entry = dispatcher.decide_inline(key, plan.query, plan.expected, plan.items[i])
            plan.entries[i] = entry
            fresh.append((key, entry))
    await dispatcher.to_memo(fresh)


def _from_memo(
    plan: RowPlan, i: int, key: str, found: dict[str, MemoEntry], dispatcher: Dispatcher
) -> bool:
    """Item `i` of the row from the batch's memo read, when it was there (a memo hit)."""
    entry = found.get(key)
    if entry is None:
        return False
    dispatcher.counters.memo_hits += 1
    plan.entries[i] = entry
    plan.paid[i] = dispatcher.carry(key)
    return True


async def _lookup(
    plan: RowPlan, found: dict[str, MemoEntry], dispatcher: Dispatcher, per_row: bool
) -> None:
    if plan.status != STATUS_OK:
        return
    counters = dispatcher.counters
    counters.items += len(plan.items)
    if _all_found(plan, found, dispatcher):
        return
    missing: list[int] = []
    known_now = dispatcher.known
    # item by item (an HTTP judge): a missing item's call is reserved as soon as it is found
    # missing, before any await, so a duplicate of it (later in this row, or in a batch
    # resolved while this one sends its calls) waits on that call instead of making another
    reserve = dispatcher.reserve if dispatcher.decider is None and not per_row else None
    reserved: list[tuple[int, ItemOutcome]] = []
    for i, key in enumerate(plan.keys):
        if key in found and _from_memo(plan, i, key, found, dispatcher):
            continue
        known = known_now(key)
        if known is None:
            plan.paid[i] = PAID
            if reserve is not None:
                reserved.append((i, reserve(key)))
            else:
                missing.append(i)
        elif isinstance(known, ItemOutcome):
            counters.dedup_hits += 1
            plan.waits.append((i, known))
        else:
            counters.dedup_hits += 1
            plan.entries[i] = known
    if missing and dispatcher.decider is not None and not per_row:
        assert plan.query is not None
        for i in missing:
            request = ItemRequest(plan.query, plan.expected, plan.items[i])
            plan.entries[i] = await dispatcher.decide_now(plan.keys[i], request)
    elif reserved:
        plan.waits.extend(reserved)
        await _send_reserved(plan, reserved, dispatcher)
    elif missing:  # --mode row: one call for the row (its outcomes are reserved as it is sent)
        await _submit_row(plan, missing, dispatcher)


async def _collect(plans: MemoryObjectReceiveStream[RowPlan], counters: RunCounters) -> None:
    async with plans:
        async for plan in plans:
            for outcome in plan.extra:
                await outcome.wait()
                if outcome.entry is not None:
                    t_in, t_out = plan.extra_tokens
                    plan.extra_tokens = (
                        t_in + outcome.entry[INPUT_TOKENS],
                        t_out + outcome.entry[OUTPUT_TOKENS],
                    )
            for i, outcome in plan.waits:
                if not outcome.done:
                    await outcome.wait()
                plan.entries[i] = outcome.entry
                if outcome.error is not None and plan.error is None:
                    plan.error = f"{outcome.error} (item #{i + 1})"
            if plan.error is not None and plan.status == STATUS_OK:
                plan.status = STATUS_FAILED
            counters.rows_judged += 1


async def _send_reserved(
    plan: RowPlan, reserved: list[tuple[int, ItemOutcome]], dispatcher: Dispatcher
) -> None:
    """The calls `_lookup` reserved for the row's missing items, to the workers."""
    assert plan.query is not None
    for i, outcome in reserved:
        request = ItemRequest(plan.query, plan.expected, plan.items[i])
        await dispatcher.send_item(plan.keys[i], request, outcome)


async def _submit_row(plan: RowPlan, missing: list[int], dispatcher: Dispatcher) -> None:
    assert plan.query is not None
    keys = [plan.keys[i] for i in range(len(plan.items))]
    outcomes = await dispatcher.submit_row(plan.query, plan.expected, plan.items, keys)
    plan.waits.extend((i, outcomes[i]) for i in missing)
    taken = set(missing)
    plan.extra.extend(o for i, o in enumerate(outcomes) if i not in taken)
