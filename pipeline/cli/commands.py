"""What each `ctxprec` subcommand does once its command line is parsed (`ctxprec.cli.main` parses
it and imports this module only for a command that runs: the imports here are the heavy ones).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from ctxprec.analysis.compare import compare, drop_gate, gate_figure, sides_from_args
from ctxprec.analysis.quality_gate import (
    EMPTY_GATE_EXIT,
    empty_gate_message,
    gate_exit,
    gate_failed,
    gate_line,
)
from ctxprec.batchapi.figures import batch_estimate, batch_line, render_batch_estimate
from ctxprec.batchapi.run import check_batch_provider
from ctxprec.cli.batches import list_batches, render_batches
from ctxprec.cli.main import _NOT_FOR_ESTIMATE, _config
from ctxprec.config import Config, load_config, parse_duration
from ctxprec.connectors.sources import input_texts
from ctxprec.engines.choice import Engine, choose
from ctxprec.run.driver import RunOptions
from ctxprec.run.estimate import estimate, render_estimate
from ctxprec.run.tracking import check_tracking, log_comparison
from ctxprec.storage.core.constants import STATUS_FAILED
from ctxprec.storage.core.errors import NothingToCompareError, UserError
from ctxprec.storage.core.figures import counted, figure_text, round_figure
from ctxprec.storage.core.options import BatchOptions, CompareOptions
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.core.settings import DEFAULT_KS
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write_text
from ctxprec.storage.files.objpath import out_path, with_options
from ctxprec.storage.outdir import statefile
from ctxprec.storage.outdir.dataset import scored_ids
from ctxprec.storage.outdir.ownership import (
    check_claimable,
    incomplete_parts,
    missing_rows_line,
    read_manifest,
)
from ctxprec.storage.outdir.status import unfinished
from ctxprec.storage.report.audit import audit_lines
from ctxprec.storage.report.charts import CHARTS_INSTALL, charts_available
from ctxprec.storage.report.compare import check_compare_target, render_text, write_compare
from ctxprec.storage.report.estimate import estimate_sentence
from ctxprec.storage.report.summary import build_summary, seconds, write_summary
from ctxprec.storage.report.trend import trend_text
from ctxprec.storage.report.words import failure_groups

__all__ = ["cmd_batches", "cmd_compare", "cmd_estimate", "cmd_score", "cmd_summary"]


def _prepared(
    run: Callable[[argparse.Namespace, Seams], int],
) -> Callable[[argparse.Namespace, Seams], int]:
    """OUTDIR arguments turned into paths before the command runs (a URI that cannot be used
    is refused here: exit 2)."""

    @functools.wraps(run)
    def command(args: argparse.Namespace, seams: Seams) -> int:
        for name in ("output", "outdir"):
            value = getattr(args, name, None)
            # an OutdirArg (a str); not isinstance(OutdirArg): under `python -m ctxprec.cli.main`
            # the parser's class is __main__'s, not this import's
            if isinstance(value, str):
                setattr(args, name, out_path(str(value)))
        return run(args, seams)

    return command


def _engine(args: argparse.Namespace) -> Engine:
    """What the flags say about where the run executes (`choose` decides and refuses)."""
    batch = None
    if args.batch_wait is not None or args.batch_fallback != BatchOptions().fallback:
        wait = None if args.batch_wait is None else parse_duration(args.batch_wait)
        batch = BatchOptions(wait_s=wait, fallback=args.batch_fallback)
    return Engine(args.engine, scheduler=args.scheduler, workers=args.workers, batch=batch)


_YOUNG_THRESHOLD = 100_000  # new container objects between young collections (CPython: 700)


@contextlib.contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """Python's cyclic garbage collector during a score run: what was imported before it
    (Polars, PyArrow, aiohttp and their tables: hundreds of thousands of objects that live
    until exit) is left out of its passes (`gc.freeze`), and young collections run after
    100,000 new objects instead of 700. Each judge call allocates a few hundred short-lived
    objects; with the defaults the collector took ~17 % of a 6,000-call run's CPU (the bare
    aiohttp loop's: ~10 %), at 10,000 ~6 %. A warm re-run's batches (10,000 items of tuples,
    lists and row plans each) crossed 10,000 every batch: 0.4 s of collections in a 1 M-item
    run, each one stopping every thread; at 100,000 none. Undone when the run ends (a score run in a
    longer-lived process, e.g. a test, gives it back as it was)."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(_YOUNG_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def _cmd_score(args: argparse.Namespace, seams: Seams) -> int:
    cfg = _config(args)
    seams.at("config", cfg)
    args.output = with_options(args.output, cfg.storage)  # [storage] of the TOML, if any
    progress = "off" if args.quiet else args.progress
    run = choose(cfg, _engine(args))
    options = RunOptions(
        overwrite=args.overwrite,
        incremental=args.incremental,
        progress=progress,
        wait_lock=args.wait_lock,
        seams=seams,
    )
    with _collector_for_a_run():
        result = run(args.input, args.output, cfg, options)
    batch = result.summary.get("run", {}).get("engine", {}).get("batch_api")
    for error in result.sink_errors:
        print(
            f"ctxprec: sink failed: {error}; the Parquet output is complete and the table is as "
            "it was: fix the cause and run the same command again to load it",
            file=sys.stderr,
        )
    code = gate_exit(result.exit_code, result.gate)
    if args.quiet:
        line = _quiet_line(result.summary, args.output)
        if batch:
            line["batch_api"] = {k: batch.get(k) for k in ("batch_ids", "lines_sent", "cost_usd")}
        if result.gate is not None:
            line["quality_gate"] = result.gate.as_dict()
        if result.tracking:  # --mlflow, --otel: what was logged and sent
            line["tracking"] = result.tracking
        print(json.dumps(line | {"exit_code": code}))
    else:
        print(_human_line(result.summary, args.output))
        if batch:
            print(batch_line(batch))
        if result.gate is not None and result.gate.outcome == "passed":
            print(f"  gate: {gate_line(result.gate)}")  # a failed one's line is on stderr
    return code


def _quiet_line(summary: dict[str, Any], outdir: Path) -> dict[str, Any]:
    run = summary.get("run", {})
    t, cost = summary.get("tokens") or {}, summary.get("cost_usd") or {}
    return {
        "outdir": str(outdir),
        "rows": summary.get("rows"),
        "score_mean": summary.get("score", {}).get("mean"),
        "rows_this_run": run.get("rows_this_run"),
        "judge_calls": run.get("judge_calls"),
        "memo_hits": run.get("memo_hits"),
        "retries": run.get("judge", {}).get("retries"),
        "rate_limited": run.get("judge", {}).get("rate_limited"),
        "failures": summary.get("failures"),
        "sinks": run.get("sinks"),
        "sink_errors": run.get("sink_errors"),
        "wall_s": None if run.get("wall_s") is None else round_figure(run["wall_s"], 2),
        "notices": run.get("notices") or [],
        # what this run paid (its judge calls; memo hits pay nothing), and what the output's
        # rows' verdicts cost when first paid
        "paid": {
            "input_tokens": t.get("paid_input_this_run"),
            "output_tokens": t.get("paid_output_this_run"),
            "cost_usd": cost.get("paid_this_run"),
        },
        "verdicts_all_rows": {
            "input_tokens": t.get("verdict_input_all_rows"),
            "output_tokens": t.get("verdict_output_all_rows"),
            "cost_usd": cost.get("verdicts_all_rows"),
        },
        "all_runs": (summary.get("history") or {}).get("total"),  # the output's history: paid
    }


def _human_line(summary: dict[str, Any], outdir: Path, *, rebuilt: bool = False) -> str:
    """What `score` prints (this run apart from the output's history) or, `rebuilt`, what
    `summary` prints (the output's runs; nothing said as if it had just run)."""
    rows = summary.get("rows", {})
    sc = summary.get("score", {})
    figures = "  ".join(f"{k} {_num(sc.get(k))}" for k in ("mean", "median", "p10", "p90"))
    lines = [
        *(f"ctxprec: {notice}" for notice in (summary.get("run") or {}).get("notices") or []),
        f"ctxprec: {counted(rows.get('total', 0), 'row')} -> {outdir}  (ok {rows.get('ok', 0):,}, "
        f"empty_context {rows.get('empty_context', 0):,}, failed {rows.get('failed', 0):,})",
        f"  score {figures}",
        *_estimate_lines(summary),
        *(
            [*_runs_lines(summary), *_verdicts_line(summary)]
            if rebuilt
            else _this_run_lines(summary)
        ),
        f"  summary: {layout.summary_md(outdir)}",
    ]
    lines += failure_lines(summary.get("failures") or {})
    return "\n".join(lines)


def _estimate_lines(summary: dict[str, Any]) -> list[str]:
    """Each corrected estimate in words (labels, then the audit judge), then the audit judge's
    agreement with the first and both judges' costs."""
    estimates = summary.get("estimates") or (
        [summary["estimate"]] if summary.get("estimate") else []
    )
    lines = [f"  estimate: {said}" for e in estimates if (said := estimate_sentence(e))]
    return lines + [f"  {line}" for line in audit_lines(summary.get("audit"))]


def failure_lines(failures: dict[str, int]) -> list[str]:
    """What to do about failed rows (`words.failure_groups`: the summaries say it alike): a
    re-run retries judge failures; unreadable replies and invalid input are said apart."""
    groups = failure_groups(failures, sep=" x")
    return [f"  {rows} ({causes}); {advice}" for rows, causes, advice in groups]


def _this_run_lines(summary: dict[str, Any]) -> list[str]:
    run = summary.get("run", {})
    judge = run.get("judge") or {}
    wall = seconds(run.get("wall_s") or 0)
    paid = _paid_text(summary)
    if not run.get("rows_this_run") and summary.get("rows", {}).get("total"):
        lines = [f"  this run: nothing new to score, every row was already there ({wall}{paid})"]
    else:
        lines = [
            f"  this run: {counted(run.get('rows_this_run') or 0, 'row')}, "
            f"{counted(run.get('judge_calls') or 0, 'judge call')}, "
            f"{counted(run.get('memo_hits') or 0, 'memo hit')}, "
            f"{counted(judge.get('retries') or 0, 'retry')}, "
            f"{judge.get('rate_limited') or 0:,} 429s, "
            f"{wall}{paid}"
        ]
    total = (summary.get("history") or {}).get("total") or {}
    if total.get("runs", 0) > 1:
        lines += _runs_lines(summary)
    lines += _verdicts_line(summary)
    for loaded in run.get("sinks") or []:
        lines.append(
            f"  sink {loaded['sink']}: {counted(loaded['rows_added'], 'row')} added, "
            f"{loaded['rows_skipped']} already there"
        )
    return lines


def _runs_lines(summary: dict[str, Any]) -> list[str]:
    """The output's history in one line: runs, rows scored, judge calls, wall time, cost."""
    total = (summary.get("history") or {}).get("total")
    if not total:
        return []
    cost = (
        "" if total.get("paid_cost_usd") is None else f", paid {_num(total['paid_cost_usd'])} USD"
    )
    runs = f"{total['runs']} run" + ("s" if total["runs"] != 1 else "")
    return [
        f"  all runs: {runs}, {counted(total['rows_this_run'], 'row')} scored, "
        f"{counted(total['judge_calls'], 'judge call')}, "
        f"{counted(total['memo_hits'], 'memo hit')}, "
        f"{seconds(total['wall_s'])}{cost}"
    ]


def _paid_text(summary: dict[str, Any]) -> str:
    """What this run paid, for its line: ", paid 0.0017 USD (9,099 / 574 tokens)" (the cost
    from [prices]; tokens alone when the model has no price)."""
    t, cost = summary.get("tokens") or {}, (summary.get("cost_usd") or {}).get("paid_this_run")
    t_in, t_out = t.get("paid_input_this_run"), t.get("paid_output_this_run")
    tokens = f"{_num(t_in or 0)} / {_num(t_out or 0)} tokens"
    if cost is None:
        return f", paid {tokens} (no price known)" if t_in or t_out else ""
    return f", paid {_num(cost)} USD" + (f" ({tokens})" if t_in or t_out else "")


def _verdicts_line(summary: dict[str, Any]) -> list[str]:
    """What the output's rows' verdicts cost when first paid, beside what was paid: a night
    judged from the memo paid nothing though its verdicts once cost something."""
    t, cost = summary.get("tokens") or {}, summary.get("cost_usd") or {}
    t_in, t_out = t.get("verdict_input_all_rows"), t.get("verdict_output_all_rows")
    if not t_in and not t_out:
        return []
    usd = cost.get("verdicts_all_rows")
    money = "" if usd is None else f"{_num(usd)} USD, "
    rows = counted(summary.get("rows", {}).get("total", 0), "row")
    return [
        f"  verdicts of the {rows}: {money}{_num(t_in)} / {_num(t_out or 0)} tokens when "
        "first paid (a memo hit is not paid again)"
    ]


def _num(value: Any) -> str:
    return figure_text(value)  # the one rounding rule (storage/core/figures.py)


def _cmd_summary(args: argparse.Namespace, seams: Seams) -> int:
    problem = unfinished(args.outdir)
    if problem:
        raise UserError(problem)
    confine.check_tree(args.outdir)  # the summary is written where no link leads
    fix = "run the `ctxprec score` command again with --overwrite to write it anew"
    run = statefile.read_json(args.outdir, layout.run_info(args.outdir), statefile.RUN_INFO, fix)
    manifest = read_manifest(args.outdir) or {}
    if incomplete := incomplete_parts(args.outdir):
        raise UserError(
            f"{missing_rows_line(args.outdir, incomplete)}: a summary now would leave them out; "
            "run the same `ctxprec score` command again (without --overwrite) to score them again"
        )
    describe = manifest.get("describe", {})
    group_by = args.group_by or run.get("group_by")
    summary = build_summary(
        args.outdir,
        run,
        scale=float(describe.get("scale", 1.0)),
        group_by=group_by,
        ks=describe.get("ks", list(DEFAULT_KS)),
    )
    if args.group_by and (note := (summary.get("by_group") or {}).get("note")):
        raise UserError(f"--group-by {args.group_by}: {note}; name one of those columns")
    write_summary(args.outdir, summary, texts=input_texts(describe))
    print(_human_line(summary, args.outdir, rebuilt=True))
    if not charts_available():
        print(f"ctxprec: note: no charts drawn: they need matplotlib ({CHARTS_INSTALL})",
              file=sys.stderr)  # fmt: skip

    if text := trend_text(summary.get("trend")):
        print(text)
    return 0


def _refuse_estimate_flags(args: argparse.Namespace) -> None:
    given = [flag for key, flag in _NOT_FOR_ESTIMATE.items() if getattr(args, key) is not None]
    if given:
        raise UserError(
            f"`ctxprec estimate` does not use {', '.join(given)}: they change how rows are "
            "scored or written, not which judge calls a run makes; drop them here"
        )


def _cmd_estimate(args: argparse.Namespace, seams: Seams) -> int:
    _refuse_estimate_flags(args)
    if args.incremental and args.output is None:
        raise UserError("estimate --incremental needs -o OUTDIR: the folder to add to")
    cfg = _config(args)
    skip = None
    if args.output is not None and args.output.is_dir():
        # parts gone or damaged are scored again by the next run: their rows count as to do
        if incomplete := incomplete_parts(args.output):
            print(f"ctxprec: note: {missing_rows_line(args.output, incomplete)}; the next run "
                  "scores them again, and they are counted here", file=sys.stderr)  # fmt: skip
        have = scored_ids(args.output, without=incomplete)
        skip = have.filter(pl.col("status") != STATUS_FAILED).get_column("id")
    est = estimate(args.input, cfg, skip_ids=skip)
    if cfg.judge.batch_api:
        check_batch_provider(cfg)
        est = batch_estimate(est, cfg)
    text = render_estimate(est)
    if "batch_api" in est:
        text += "\n" + render_batch_estimate(est)
    print(json.dumps(est, indent=2) if args.json else text)
    if args.output is not None:
        check_claimable(args.output)
        atomic_write_text(layout.estimate(args.output), json.dumps(est, indent=2))
    return 0


def _cmd_compare(args: argparse.Namespace, seams: Seams) -> int:
    a, b = sides_from_args(args.outputs, args.a, args.b)
    fields = CompareOptions.__dataclass_fields__  # the flags' dests are the options' names
    opts = CompareOptions(**{name: getattr(args, name) for name in fields})
    if args.output is not None:
        check_compare_target(args.output)  # before the work: nothing of anyone else's replaced
    tracked = _config(args) if getattr(args, "mlflow.enabled", None) else None
    if tracked is not None:
        check_tracking(tracked)  # --mlflow without its extra: said before the work
    try:
        report = compare(a, b, opts)
    except NothingToCompareError as exc:
        if args.fail_drop is None:
            raise
        return _empty_drop_gate(args, str(exc))
    message = None if args.fail_drop is None else drop_gate(report, args.fail_drop, args.margin)
    if args.fail_drop is not None:
        report["gate"] = {"fail_drop": args.fail_drop, "failed": bool(message), "message": message,
                          "figure": gate_figure(report)[0], "outcome": "failed" if message
                          else "passed"}  # fmt: skip
        if args.margin is not None:
            report["gate"]["margin"] = args.margin
    if args.output is not None:
        write_compare(args.output, report)
    print(
        json.dumps(report, indent=2, default=str) if args.json else render_text(report, args.output)
    )
    if tracked is not None:  # --mlflow: the difference and the gate's verdict
        _log_comparison(args, report, tracked)
    return 0 if message is None else gate_failed(0, message)


def _empty_drop_gate(args: argparse.Namespace, why: str) -> int:
    """`--fail-drop` with nothing to compare (an empty night, a side that matches no row):
    exit 7, or a note and 0 with --pass-empty; --json prints the gate alone."""
    message = empty_gate_message(f"--fail-drop {args.fail_drop:g}", why, args.pass_empty,
                                 "--pass-empty")  # fmt: skip
    if args.json:
        gate = {"fail_drop": args.fail_drop, "outcome": "empty", "failed": not args.pass_empty,
                "pass_empty": args.pass_empty, "message": message}  # fmt: skip
        print(json.dumps({"gate": gate}, indent=2))
    if args.pass_empty:
        print(f"ctxprec: note: {message}", file=sys.stderr)
        return 0
    return gate_failed(0, message, EMPTY_GATE_EXIT)


def _log_comparison(args: argparse.Namespace, report: dict[str, Any], cfg: Config) -> None:
    """compare.json/.md/.html of `-o DIR` as the MLflow run's files, else compare.json alone."""
    if args.output is not None:
        found = [layout.compare_file(args.output, name) for name in layout.COMPARE_FILES]
        log_comparison(report, cfg, [p for p in found if p.is_file()])
        return
    with tempfile.TemporaryDirectory(prefix="ctxprec-compare-") as folder:
        path = layout.compare_file(Path(folder), layout.COMPARE_JSON)
        path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        log_comparison(report, cfg, [path])


def _cmd_batches(args: argparse.Namespace, seams: Seams) -> int:
    given = {
        key: getattr(args, key)
        for key in (
            "judge.model",
            "judge.base_url",
            "judge.api_key_env",
            "judge.timeout_s",
            "judge.audit_model",
            "judge.audit_base_url",
        )
        if getattr(args, key, None) is not None
    }
    judge = load_config(args.config, given).judge
    rows = list_batches(args.outdir, cancel=args.cancel, seams=seams, judge=judge)
    print(json.dumps(rows, indent=2) if args.json else render_batches(rows))
    return 0


cmd_score = _prepared(_cmd_score)
cmd_summary = _prepared(_cmd_summary)
cmd_estimate = _prepared(_cmd_estimate)
cmd_compare = _prepared(_cmd_compare)
cmd_batches = _prepared(_cmd_batches)
