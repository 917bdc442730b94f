"""The `ctxprec` command: `score`, `estimate`, `summary`, `compare`, `batches`, `cache`,
`providers` and `config`. Exit codes:
0 all rows scored; 1 some rows failed (output still written); 2 usage/config/input/output-folder
errors before any judge call (a folder ctxprec did not write, one another run is writing, an
object-store URL, a sink without its extra) or a write that failed mid-run (full disk, read-only
folder); 3 an internal error; 5 a quality gate failed (--fail-under, --fail-drop; 1 wins when rows
failed too); 4 the judge refused the run (auth, quota, unknown model, a request it
rejects that cannot be adapted: finished parts kept, the same command resumes once fixed);
6 provider batches still pending after --batch-wait (the same command collects
them later); 130 interrupted (finished parts kept; the same command resumes); 141 stdout was
closed early (`ctxprec summary OUT | head`): nothing more is printed, as `head` expects.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from connectors.judges.secrets import RedactingFilter
from pipeline.batch_run import (
    BatchOptions,
    batch_estimate,
    batch_line,
    check_batch_provider,
    list_batches,
    parse_duration,
    render_batch_estimate,
    render_batches,
    score_batch,
)
from pipeline.cache_cmd import add_cache_command, run_cache_command
from pipeline.cli_help import Parser, show_defaults
from pipeline.compare import CompareOptions, compare, drop_gate, sides_from_args
from pipeline.config import FLAGS, Config, flag_type, load_config
from pipeline.config_cmd import add_config_command, example_configs, run_config_command
from pipeline.driver import RunResult
from pipeline.engines import score_dask
from pipeline.estimate import estimate, render_estimate
from pipeline.flow import score
from pipeline.gate import gate_exit, ids_before, run_mean, under_gate
from pipeline.providers_cmd import add_providers_command, run_providers_command
from pipeline.version import __version__
from storage.atomic import atomic_write_text
from storage.compare_report import check_compare_target, render_text, write_compare
from storage.core.constants import STATE_DIR, STATUS_FAILED
from storage.core.errors import (
    BatchesPendingError,
    CtxprecError,
    JudgeError,
    JudgeRefusedRunError,
    UserError,
)
from storage.core.figures import figure_text
from storage.core.settings import DEFAULT_KS, settings
from storage.dataset import scored_ids
from storage.objpath import out_path, with_options
from storage.ownership import check_claimable
from storage.report import build_summary, seconds, write_summary
from storage.status import unfinished
from storage.trend import trend_text

__all__ = ["build_parser", "main"]

SETTINGS = {s.key: s for s in settings()}
MAP_FIELDS = {s.name for s in SETTINGS.values() if s.flag and s.flag.startswith("--map ")}


def _add_setting(g: Any, key: str, **extra: Any) -> None:
    """The flag of a setting, from its field in storage/core/settings.py: flag, help, type,
    choices and metavar; the value lands under the setting's dotted key (`args.<key>`)."""
    s = SETTINGS[key]
    assert s.flag, key
    kwargs: dict[str, Any] = {"dest": key, "help": s.help, "default": None}
    if isinstance(s.default, bool):  # --no-memo turns a True off, --batch-api a False on
        kwargs.update(action="store_const", const=not s.default)
    else:
        metavar = s.metavar or s.flag.lstrip("-").upper().replace("-", "_")
        if s.choices:  # the usage line and the help list them: --mode {item,row}
            kwargs["choices"] = list(s.choices)
            metavar = s.metavar or "{" + ",".join(s.choices) + "}"
        kwargs.update(type=flag_type(key), metavar=metavar)
    g.add_argument(s.flag, **{**kwargs, **extra})


def _add_judge_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judge")
    for key in ("model", "base_url", "api_key_env", "mode", "timeout_s", "max_retries"):
        _add_setting(g, f"judge.{key}")
    _add_setting(g, "scoring.reason")
    _add_setting(g, "run.recheck")  # issue 22: score runs it, estimate prices it


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input")
    g.add_argument(
        "input",
        help="a Parquet, JSON Lines (.jsonl/.ndjson/.json) or CSV file (text formats also .gz or "
        ".zst), a folder or glob of them, or a Hive-partitioned dataset; a path or an s3:// "
        "gs:// az:// URL",
    )
    g.add_argument(
        "--config",
        type=Path,
        help="a TOML config file; `ctxprec config NAME > my.toml` writes an example to start "
        f"from ({', '.join(example_configs())})",
    )
    g.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help="map id, query, expected, context or labels to a column; several pairs by commas "
        "(query=question,expected=ground_truth) or by repeating the flag",
    )
    for key in ("columns.extractor", "columns.passthrough", "run.batch_rows"):
        _add_setting(g, key)
    lim = p.add_argument_group("limits and memo")
    for key in ("concurrency", "rpm", "tpm", "adaptive"):
        _add_setting(lim, f"limits.{key}")
    _add_setting(lim, "run.cache_dir")
    _add_setting(lim, "run.memo")
    s = p.add_argument_group("scoring")
    for key in ("scoring.scale", "scoring.ks", "output.group_by"):
        _add_setting(s, key)


WAIT_LOCK_S = 3600.0  # --wait-lock without a number


def _add_lock_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-lock",
        nargs="?",
        type=float,
        const=WAIT_LOCK_S,
        default=0.0,
        metavar="SECONDS",
        help="if another run is writing OUTDIR, wait for it (default: exit 2 at once; "
        f"without SECONDS: up to {WAIT_LOCK_S:g} s)",
    )


def _add_batch_flags(p: argparse.ArgumentParser, *, score: bool) -> None:
    g = p.add_argument_group("provider batch API")
    _add_setting(g, "judge.batch_api")
    if not score:
        return
    g.add_argument(
        "--batch-wait",
        metavar="DURATION",
        help="wait at most this long (0, 90s, 30m, 2h, 1d) for the batches; then exit 6 and "
        "collect them with the same command later (default: wait until they end)",
    )
    g.add_argument(
        "--batch-fallback",
        choices=["batch", "online"],
        default="batch",
        help="where lines that expired or errored go again: new batches (default) or online",
    )


def _batch_options(args: argparse.Namespace) -> Any:
    wait = None if args.batch_wait is None else parse_duration(args.batch_wait)
    return BatchOptions(wait_s=wait, fallback=args.batch_fallback)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ctxprec",
        description="Context precision (MAP) of "
        "retrieved context, judged item by item, over Parquet.",
    )
    parser.add_argument("--version", action="version", version=f"ctxprec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("score", help="score a dataset into OUTDIR")
    _add_data_flags(sc)
    _add_judge_flags(sc)
    sc.add_argument("-o", "--output", required=True, type=_outdir, help="output folder or URI")
    _add_setting(sc, "output.partition_by")
    _add_setting(sc, "output.sinks", action="append")
    sc.add_argument("--overwrite", action="store_true", help="replace what OUTDIR holds")
    sc.add_argument("--incremental", action="store_true", help="add new ids to an existing OUTDIR")
    _add_lock_flag(sc)
    sc.add_argument(
        "--progress",
        choices=["auto", "bar", "log", "off"],
        default="auto",
        help="a bar on a terminal, a log line every 10 s otherwise (auto), or none",
    )
    sc.add_argument("--quiet", action="store_true", help="print only one JSON line at the end")
    en = sc.add_argument_group("engine")
    en.add_argument("--engine", choices=["local", "dask"], default="local", help="where to run")
    en.add_argument("--scheduler", metavar="ADDRESS", help="dask: an existing cluster's scheduler")
    en.add_argument("--workers", type=int, help="dask: local cluster size (default: one per core)")
    _add_batch_flags(sc, score=True)
    es = sub.add_parser("estimate", help="what a score run would cost, without judge calls")
    _add_data_flags(es)
    _add_judge_flags(es)
    _add_batch_flags(es, score=False)
    es.add_argument("--json", action="store_true", help="print JSON")
    es.add_argument(
        "--incremental",
        action="store_true",
        help="count only ids not yet scored in -o OUTDIR (rows already there are never counted)",
    )
    es.add_argument(
        "-o",
        "--output",
        type=_outdir,
        help="the folder a score run would write: ids already scored there are not counted, "
        "and the estimate is saved there so that run's summary shows estimate vs actual",
    )
    sm = sub.add_parser("summary", help="rebuild summary.json/.md of an existing OUTDIR")
    sm.add_argument("outdir", type=_outdir, help="an output folder written by `ctxprec score`")
    sm.add_argument(
        "--group-by", metavar="COL", help="one column to break scores down by (default: the run's)"
    )
    add_cache_command(sub)
    add_config_command(sub)
    _add_gate_flags(sc)
    _add_compare_parser(sub)
    bt = sub.add_parser("batches", help="list (or cancel) the provider batches of an OUTDIR")
    bt.add_argument("outdir", type=_outdir, help="an output folder of a `score --batch-api` run")
    bt.add_argument("--cancel", action="store_true", help="cancel the batches still running")
    bt.add_argument("--json", action="store_true", help="print JSON")
    add_providers_command(sub)  # `ctxprec providers` (pipeline/providers_cmd.py)
    show_defaults(parser)
    for action in es._actions:  # accepted only to be refused with a reason (see below)
        if action.dest in _NOT_FOR_ESTIMATE:
            action.help = argparse.SUPPRESS
    return parser


class _RefusedOutdir:
    """An OUTDIR argument that cannot be used; `main` raises its error (exit 2)."""

    def __init__(self, error: UserError) -> None:
        self.error = error


def _outdir(text: str) -> Any:
    """OUTDIR: a local folder, or an s3:// gs:// az:// abfs[s]:// file:// URI (storage.objpath)."""

    try:
        return out_path(text)
    except UserError as exc:
        return _RefusedOutdir(exc)


def _add_gate_flags(p: argparse.ArgumentParser) -> None:
    _add_setting(p, "gate.fail_under")


def _add_compare_parser(sub: Any) -> None:
    cp = sub.add_parser("compare", help="paired comparison of two outputs, or two slices of one")
    cp.add_argument("outputs", nargs="+", metavar="OUTDIR", help="A B, or one OUTDIR with --a/--b")
    cp.add_argument("--a", action="append", default=[], metavar="COL=VALUE", help="rows of A")
    cp.add_argument("--b", action="append", default=[], metavar="COL=VALUE", help="rows of B")
    cp.add_argument("--on", default="id", metavar="COL", help="column pairing rows (default id)")
    cp.add_argument("--group-by", metavar="COL", help="deltas per value of COL")
    cp.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    cp.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    cp.add_argument("--top", type=int, default=10, help="rows that changed most to show")
    cp.add_argument("--strict", action="store_true", help="refuse sides with different judges")
    cp.add_argument("--fail-drop", type=float, metavar="X", help="exit 5 when B is worse by > X")
    # -- honest intervals (issue 22): clustered bootstrap and non-inferiority
    cp.add_argument("--cluster-by", metavar="COL", help="resample pairs sharing COL together "
                    "(default: the query column when several pairs share a query)")  # fmt: skip
    cp.add_argument("--margin", type=float, metavar="X", help="test that B is no worse than A "
                    "by more than X; with --fail-drop, exit 5 unless shown")  # fmt: skip
    cp.add_argument("-o", "--output", type=Path, help="write compare.json/.md/.png into DIR")
    cp.add_argument("--json", action="store_true", help="print compare.json to stdout")


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted key: value} of every setting given on the command line (argparse dests are the
    keys); `--map FIELD=COLUMN` sets [columns] FIELD."""
    flags = {k: v for k, v in vars(args).items() if k in SETTINGS and v not in (None, [])}
    for item in (pair for given in args.map for pair in _map_pairs(given)):
        field, sep, column = item.partition("=")
        field = field.strip()
        if not sep or field not in MAP_FIELDS or not column.strip():
            raise UserError(
                f"--map {item!r}: write FIELD=COLUMN with FIELD one of "
                f"{', '.join(sorted(MAP_FIELDS))}"
            )
        flags[f"columns.{field}"] = column.strip()
    return flags


def _map_pairs(given: str) -> list[str]:
    """`--map query=question,expected=ground_truth`: a comma starts a new pair only where a field
    name and `=` follow it, so a column named `a,b` still maps (`--map context=a,b`)."""
    fields = "|".join(sorted(MAP_FIELDS))
    return re.split(rf",\s*(?=(?:{fields})\s*=)", given)


def _check_conflicts(args: argparse.Namespace) -> None:
    if getattr(args, "overwrite", False) and getattr(args, "incremental", False):
        raise UserError("--overwrite and --incremental contradict each other; pick one")
    if getattr(args, "wait_lock", 0.0) < 0:
        raise UserError(f"--wait-lock {args.wait_lock:g}: give a number of seconds, 0 or more")
    if getattr(args, "quiet", False) and args.progress in ("bar", "log"):
        raise UserError(f"--quiet and --progress {args.progress} contradict each other")


def _config(args: argparse.Namespace) -> Config:
    _check_conflicts(args)
    return load_config(args.config, _flags(args))


def _cmd_score(args: argparse.Namespace) -> int:
    cfg = _config(args)
    args.output = with_options(args.output, cfg.storage)  # [storage] of the TOML, if any
    progress = "off" if args.quiet else args.progress
    run: Callable[..., RunResult] = score
    if args.engine == "dask":
        run = functools.partial(score_dask, scheduler=args.scheduler, workers=args.workers)
    elif args.scheduler or args.workers:
        raise UserError("--scheduler and --workers are for --engine dask; add it")

    before = (
        ids_before(args.output) if cfg.gate.fail_under is not None and args.incremental else None
    )
    if cfg.judge.batch_api:
        check_batch_provider(cfg)
        if args.engine == "dask":
            raise UserError("--batch-api runs on the local engine; drop --engine dask")
        run = functools.partial(score_batch, options=_batch_options(args))
    elif args.batch_wait is not None or args.batch_fallback != "batch":
        raise UserError("--batch-wait and --batch-fallback are for --batch-api; add it")
    if cfg.run.recheck > 0 and (args.engine == "dask" or cfg.judge.batch_api):  # issue 22
        drop = "--engine dask" if args.engine == "dask" else "--batch-api"
        raise UserError(f"--recheck runs on the local engine with online calls; drop {drop}")
    result = run(
        args.input,
        args.output,
        cfg,
        overwrite=args.overwrite,
        incremental=args.incremental,
        progress=progress,
        wait_lock=args.wait_lock,
    )
    batch = result.summary.get("run", {}).get("engine", {}).get("batch_api")
    if args.quiet:
        line = _quiet_line(result.summary, args.output)
        if batch:
            line["batch_api"] = {k: batch.get(k) for k in ("batch_ids", "lines_sent", "cost_usd")}
        print(json.dumps(line))
    else:
        print(_human_line(result.summary, args.output))
        if batch:
            print(batch_line(batch))
    for error in result.sink_errors:
        print(
            f"ctxprec: sink failed: {error}; the Parquet output is complete and the table is as "
            "it was: fix the cause and run the same command again to load it",
            file=sys.stderr,
        )
    if cfg.gate.fail_under is None:
        return result.exit_code
    mean, rows = run_mean(args.output, before)
    return gate_exit(result.exit_code, under_gate(mean, rows, cfg.gate.fail_under))


def _quiet_line(summary: dict[str, Any], outdir: Path) -> dict[str, Any]:
    run = summary.get("run", {})
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
        "wall_s": run.get("wall_s"),
        "notices": run.get("notices") or [],
        "all_runs": (summary.get("history") or {}).get("total"),  # the output's history
    }


def _human_line(summary: dict[str, Any], outdir: Path, *, rebuilt: bool = False) -> str:
    """What `score` prints (this run apart from the output's history) or, `rebuilt`, what
    `summary` prints (the output's runs; nothing said as if it had just run)."""
    rows = summary.get("rows", {})
    sc = summary.get("score", {})
    figures = "  ".join(f"{k} {_num(sc.get(k))}" for k in ("mean", "median", "p10", "p90"))
    lines = [
        *(f"ctxprec: {notice}" for notice in (summary.get("run") or {}).get("notices") or []),
        f"ctxprec: {rows.get('total', 0):,} rows -> {outdir}  (ok {rows.get('ok', 0):,}, "
        f"empty_context {rows.get('empty_context', 0):,}, failed {rows.get('failed', 0):,})",
        f"  score {figures}",
        *(_runs_lines(summary) if rebuilt else _this_run_lines(summary)),
        f"  summary: {outdir / 'summary.md'}",
    ]
    if rows.get("failed"):
        causes = ", ".join(f"{k} x{v}" for k, v in (summary.get("failures") or {}).items())
        lines.append(
            f"  {rows['failed']} rows failed ({causes}); re-run the same command to retry only them"
        )
    return "\n".join(lines)


def _this_run_lines(summary: dict[str, Any]) -> list[str]:
    run = summary.get("run", {})
    judge = run.get("judge") or {}
    wall = seconds(run.get("wall_s") or 0)
    if not run.get("rows_this_run") and summary.get("rows", {}).get("total"):
        lines = [f"  this run: nothing new to score, every row was already there ({wall})"]
    else:
        lines = [
            f"  this run: {run.get('rows_this_run') or 0:,} rows, {run.get('judge_calls') or 0:,} "
            f"judge calls, {run.get('memo_hits') or 0:,} memo hits, "
            f"{judge.get('retries') or 0:,} retries, {judge.get('rate_limited') or 0:,} 429s, "
            f"{wall}"
        ]
    total = (summary.get("history") or {}).get("total") or {}
    if total.get("runs", 0) > 1:
        lines += _runs_lines(summary)
    for loaded in run.get("sinks") or []:
        lines.append(
            f"  sink {loaded['sink']}: {loaded['rows_added']} rows added, "
            f"{loaded['rows_skipped']} already there"
        )
    return lines


def _runs_lines(summary: dict[str, Any]) -> list[str]:
    """The output's history in one line: runs, rows scored, judge calls, wall time, cost."""
    total = (summary.get("history") or {}).get("total")
    if not total:
        return []
    cost = "" if total.get("cost_usd") is None else f", {_num(total['cost_usd'])} USD"
    runs = f"{total['runs']} run" + ("s" if total["runs"] != 1 else "")
    return [
        f"  all runs: {runs}, {total['rows_this_run']:,} rows scored, "
        f"{total['judge_calls']:,} judge calls, {total['memo_hits']:,} memo hits, "
        f"{seconds(total['wall_s'])}{cost}"
    ]


def _num(value: Any) -> str:
    return figure_text(value)  # the one rounding rule (storage/core/figures.py)


def _cmd_summary(args: argparse.Namespace) -> int:
    problem = unfinished(args.outdir)
    if problem:
        raise UserError(problem)
    state = args.outdir / STATE_DIR / "run.json"
    run = json.loads(state.read_text(encoding="utf-8"))
    manifest = json.loads((args.outdir / STATE_DIR / "manifest.json").read_text(encoding="utf-8"))
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
    write_summary(args.outdir, summary)
    print(_human_line(summary, args.outdir, rebuilt=True))

    if text := trend_text(summary.get("trend")):
        print(text)
    return 0


# settings that change how rows are scored or written, not which judge calls a run makes
_NOT_FOR_ESTIMATE = {
    key: FLAGS[key]
    for key in (
        "scoring.scale",
        "scoring.ks",
        "output.group_by",
        "columns.passthrough",
        "limits.adaptive",
        "judge.timeout_s",
        "judge.max_retries",
        "scoring.reason",
        "run.batch_rows",
    )
}


def _refuse_estimate_flags(args: argparse.Namespace) -> None:
    given = [flag for key, flag in _NOT_FOR_ESTIMATE.items() if getattr(args, key) is not None]
    if given:
        raise UserError(
            f"`ctxprec estimate` does not use {', '.join(given)}: they change how rows are "
            "scored or written, not which judge calls a run makes; drop them here"
        )


def _cmd_estimate(args: argparse.Namespace) -> int:
    import polars as pl

    _refuse_estimate_flags(args)
    if args.incremental and args.output is None:
        raise UserError("estimate --incremental needs -o OUTDIR: the folder to add to")
    cfg = _config(args)
    skip = None
    if args.output is not None and args.output.is_dir():
        have = scored_ids(args.output)
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
        state = args.output / STATE_DIR
        atomic_write_text(state / "estimate.json", json.dumps(est, indent=2))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    a, b = sides_from_args(args.outputs, args.a, args.b)
    opts = CompareOptions(args.on, args.group_by, args.resamples, args.seed, args.top, args.strict,
                          cluster_by=args.cluster_by, margin=args.margin)  # fmt: skip
    if args.output is not None:
        check_compare_target(args.output)  # before the work: nothing of anyone else's replaced
    report = compare(a, b, opts)
    message = None if args.fail_drop is None else drop_gate(report, args.fail_drop, args.margin)
    if args.fail_drop is not None:
        report["gate"] = {"fail_drop": args.fail_drop, "failed": bool(message), "message": message}
        if args.margin is not None:
            report["gate"]["margin"] = args.margin
    if args.output is not None:
        write_compare(args.output, report)
    print(json.dumps(report, indent=2, default=str) if args.json else render_text(report))

    return gate_exit(0, message)


def _cmd_batches(args: argparse.Namespace) -> int:
    rows = list_batches(args.outdir, cancel=args.cancel)
    print(json.dumps(rows, indent=2) if args.json else render_batches(rows))
    return 0


def _setup_logging() -> None:
    """CTXPREC_LOG_LEVEL=debug|info|warning turns on stdlib logging to stderr, keys redacted."""
    level = os.environ.get("CTXPREC_LOG_LEVEL", "").strip().upper()
    if not level:
        return

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ctxprec")
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))


BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left


def main(argv: Sequence[str] | None = None) -> int:
    """The `ctxprec` command; a reader that closes stdout early (`| head`) ends it quietly."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe is noise
    except BrokenPipeError:
        # Python's recipe (docs "Note on SIGPIPE"): later writes and the final flush go nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging()
    commands = {
        "score": _cmd_score,
        "summary": _cmd_summary,
        "estimate": _cmd_estimate,
        "compare": _cmd_compare,
        "batches": _cmd_batches,
        "cache": run_cache_command,
        "providers": run_providers_command,
        "config": run_config_command,
    }
    try:
        for value in (getattr(args, "output", None), getattr(args, "outdir", None)):
            if isinstance(value, _RefusedOutdir):
                raise value.error
        return commands[args.command](args)
    except BatchesPendingError as exc:
        print(f"ctxprec: {exc}", file=sys.stderr)
        if getattr(args, "quiet", False):  # cron logs get their one JSON line
            print(json.dumps({"outdir": str(args.output), "batches_pending": str(exc)}))
        return exc.exit_code
    except JudgeRefusedRunError as exc:
        print(
            f"ctxprec: the judge refused the run: {exc}. Finished parts are kept; run the same "
            "command again once this is fixed",
            file=sys.stderr,
        )
        return exc.exit_code
    except UserError as exc:
        print(f"ctxprec: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(
            "ctxprec: interrupted; finished parts are kept; run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    except JudgeError as exc:
        print(f"ctxprec: judge error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        raise  # the reader of stdout left: `main` ends quietly
    except Exception as exc:  # the last line of defence: a message, not a traceback
        if os.environ.get("CTXPREC_DEBUG"):
            traceback.print_exc()
        print(
            f"ctxprec: internal error: {type(exc).__name__}: {exc} "
            "(set CTXPREC_DEBUG=1 for the traceback; please report it)",
            file=sys.stderr,
        )
        return CtxprecError.exit_code  # not one of ours, or a bug: 3


if __name__ == "__main__":
    sys.exit(main())
