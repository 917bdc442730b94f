"""The `ctxprec` command: `score`, `estimate` and `summary`. Exit codes: 0 all rows scored,
1 some rows failed (output still written), 2 usage/config/input errors before any judge call,
4 the judge refused the run (auth, quota, unknown model, a request it rejects and that cannot be
adapted: finished parts kept; the same command resumes once fixed), 130 interrupted (finished
parts kept; the same command resumes).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.config import Config, load_config
from pipeline.errors import CtxprecError, JudgeError, JudgeRefusedRunError

__all__ = ["build_parser", "main"]

_MAP_FIELDS = {"id", "query", "expected", "context", "labels"}


def _add_judge_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judge")
    g.add_argument("--model", help="provider/model, e.g. openai/gpt-4o-mini (default: offline)")
    g.add_argument("--base-url", help="OpenAI-compatible or Anthropic base URL")
    g.add_argument("--api-key-env", help="name of the env var holding the API key")
    g.add_argument("--mode", choices=["item", "row"], help="one call per item (default) or per row")
    g.add_argument("--timeout", type=float, help="seconds per judge call")
    g.add_argument("--max-retries", type=int, help="retries per judge call")
    g.add_argument("--reason", choices=["verdicts", "llm"], help="how the row reason is written")


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input")
    g.add_argument("input", help="Parquet file, folder, glob or Hive-partitioned dataset")
    g.add_argument("--config", type=Path, help="TOML config (see configs/)")
    g.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help="map id, query, expected, context or labels to a column (repeatable)",
    )
    g.add_argument(
        "--extractor",
        metavar="MODULE:FUNCTION",
        help="function(row: dict) -> list[str] giving the context; wins over context",
    )
    g.add_argument("--passthrough", metavar="COL[,COL]", help="columns copied to the output")
    g.add_argument("--batch-rows", type=int, help="rows per record batch / part file")
    lim = p.add_argument_group("limits and memo")
    lim.add_argument("--concurrency", type=int, help="judge calls in flight")
    lim.add_argument("--rpm", type=float, help="requests per minute (all calls)")
    lim.add_argument("--tpm", type=float, help="tokens per minute (estimated before each call)")
    lim.add_argument("--no-adaptive", action="store_true", help="do not slow down on 429 by itself")
    lim.add_argument("--cache-dir", help="memo folder (default: the user cache dir)")
    lim.add_argument("--no-memo", action="store_true", help="do not read or write the memo")
    s = p.add_argument_group("scoring")
    s.add_argument("--scale", type=float, help="score scale (default 1)")
    s.add_argument("--ks", metavar="K[,K]", help="cut-offs for precision@k, hit@k, ndcg@k")
    s.add_argument("--group-by", help="column to break scores down by in the summary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxprec",
        description="Context precision (MAP) of "
        "retrieved context, judged item by item, over Parquet.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("score", help="score a dataset into OUTDIR")
    _add_data_flags(sc)
    _add_judge_flags(sc)
    sc.add_argument("-o", "--output", required=True, type=Path, help="output folder")
    sc.add_argument("--partition-by", metavar="COL[,COL]", help="Hive-partition the output")
    sc.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="SPEC",
        help="also append to a table: delta:PATH or duckdb:FILE.duckdb:TABLE",
    )
    sc.add_argument("--overwrite", action="store_true", help="replace what OUTDIR holds")
    sc.add_argument("--incremental", action="store_true", help="add new ids to an existing OUTDIR")
    sc.add_argument("--progress", choices=["auto", "bar", "log", "off"], default="auto")
    sc.add_argument("--quiet", action="store_true", help="print only one JSON line at the end")
    en = sc.add_argument_group("engine")
    en.add_argument("--engine", choices=["local", "dask"], default="local", help="where to run")
    en.add_argument("--scheduler", metavar="ADDRESS", help="dask: an existing cluster's scheduler")
    en.add_argument("--workers", type=int, help="dask: local cluster size (default: one per core)")
    es = sub.add_parser("estimate", help="what a score run would cost, without judge calls")
    _add_data_flags(es)
    _add_judge_flags(es)
    es.add_argument("--json", action="store_true", help="print JSON")
    es.add_argument(
        "-o",
        "--output",
        type=Path,
        help="also save it in OUTDIR, so the summary of a later score run into "
        "OUTDIR shows estimate vs actual",
    )
    sm = sub.add_parser("summary", help="rebuild summary.json/.md of an existing OUTDIR")
    sm.add_argument("outdir", type=Path)
    sm.add_argument("--group-by")
    return parser


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "judge.model": args.model,
        "judge.base_url": args.base_url,
        "judge.api_key_env": args.api_key_env,
        "judge.mode": args.mode,
        "judge.timeout_s": args.timeout,
        "judge.max_retries": args.max_retries,
        "scoring.reason": args.reason,
        "columns.extractor": args.extractor,
        "columns.passthrough": args.passthrough,
        "run.batch_rows": args.batch_rows,
        "limits.concurrency": args.concurrency,
        "limits.rpm": args.rpm,
        "limits.tpm": args.tpm,
        "limits.adaptive": False if args.no_adaptive else None,
        "run.cache_dir": args.cache_dir,
        "run.memo": False if args.no_memo else None,
        "scoring.scale": args.scale,
        "scoring.ks": args.ks,
        "output.group_by": args.group_by,
        "output.partition_by": getattr(args, "partition_by", None),
        "output.sinks": getattr(args, "sink", None) or None,
    }
    for item in args.map:
        field, sep, column = item.partition("=")
        field = field.strip()
        if not sep or field not in _MAP_FIELDS or not column.strip():
            raise CtxprecError(
                f"--map {item!r}: write FIELD=COLUMN with FIELD one of "
                f"{', '.join(sorted(_MAP_FIELDS))}"
            )
        flags[f"columns.{field}"] = column.strip()
    return flags


def _check_conflicts(args: argparse.Namespace) -> None:
    if getattr(args, "overwrite", False) and getattr(args, "incremental", False):
        raise CtxprecError("--overwrite and --incremental contradict each other; pick one")
    if getattr(args, "quiet", False) and args.progress in ("bar", "log"):
        raise CtxprecError(f"--quiet and --progress {args.progress} contradict each other")


def _config(args: argparse.Namespace) -> Config:
    _check_conflicts(args)
    return load_config(args.config, _flags(args))


def _cmd_score(args: argparse.Namespace) -> int:
    from pipeline.flow import RunResult, score

    cfg = _config(args)
    progress = "off" if args.quiet else args.progress
    run: Callable[..., RunResult] = score
    if args.engine == "dask":
        from connectors.engines import score_dask

        run = functools.partial(score_dask, scheduler=args.scheduler, workers=args.workers)
    elif args.scheduler or args.workers:
        raise CtxprecError("--scheduler and --workers are for --engine dask; add it")
    result = run(
        args.input,
        args.output,
        cfg,
        overwrite=args.overwrite,
        incremental=args.incremental,
        progress=progress,
    )
    if args.quiet:
        print(json.dumps(_quiet_line(result.summary, args.output)))
    else:
        print(_human_line(result.summary, args.output))
    for error in result.sink_errors:
        print(
            f"ctxprec: sink failed: {error}; the Parquet output is complete and the table is as "
            "it was: fix the cause and run the same command again to load it",
            file=sys.stderr,
        )
    return result.exit_code


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
    }


def _human_line(summary: dict[str, Any], outdir: Path) -> str:
    rows = summary.get("rows", {})
    run = summary.get("run", {})
    sc = summary.get("score", {})
    lines = [
        f"ctxprec: {rows.get('total', 0)} rows -> {outdir}  (ok {rows.get('ok', 0)}, "
        f"empty_context {rows.get('empty_context', 0)}, failed {rows.get('failed', 0)})",
        f"  score mean {sc.get('mean')}  median {sc.get('median')}  p10 {sc.get('p10')}  "
        f"p90 {sc.get('p90')}",
        f"  this run: {run.get('rows_this_run', 0)} rows, {run.get('judge_calls', 0)} judge calls, "
        f"{run.get('memo_hits', 0)} memo hits, {run.get('judge', {}).get('retries', 0)} retries, "
        f"{run.get('judge', {}).get('rate_limited', 0)} 429s, {float(run.get('wall_s', 0)):.1f} s",
        f"  summary: {outdir / 'summary.md'}",
    ]
    for loaded in run.get("sinks") or []:
        lines.append(
            f"  sink {loaded['sink']}: {loaded['rows_added']} rows added, "
            f"{loaded['rows_skipped']} already there"
        )
    if rows.get("failed"):
        causes = ", ".join(f"{k} x{v}" for k, v in (summary.get("failures") or {}).items())
        lines.append(
            f"  {rows['failed']} rows failed ({causes}); re-run the same command to retry only them"
        )
    return "\n".join(lines)


def _cmd_summary(args: argparse.Namespace) -> int:
    from storage.report import build_summary, write_summary
    from storage.runlog import STATE_DIR

    state = args.outdir / STATE_DIR / "run.json"
    if not state.is_file():
        raise CtxprecError(
            f"{args.outdir} holds no ctxprec run (no {state}); pass an OUTDIR "
            "written by `ctxprec score`"
        )
    run = json.loads(state.read_text(encoding="utf-8"))
    manifest = json.loads((args.outdir / STATE_DIR / "manifest.json").read_text(encoding="utf-8"))
    describe = manifest.get("describe", {})
    summary = build_summary(
        args.outdir,
        run,
        scale=float(describe.get("scale", 1.0)),
        group_by=args.group_by,
        ks=describe.get("ks", [1, 3, 5]),
    )
    write_summary(args.outdir, summary)
    print(_human_line(summary, args.outdir))
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    from pipeline.estimate import estimate, render_estimate

    cfg = _config(args)
    est = estimate(args.input, cfg)
    print(json.dumps(est, indent=2) if args.json else render_estimate(est))
    if args.output is not None:
        from storage.runlog import STATE_DIR, atomic_write_text

        state = args.output / STATE_DIR
        state.mkdir(parents=True, exist_ok=True)
        atomic_write_text(state / "estimate.json", json.dumps(est, indent=2))
    return 0


def _setup_logging() -> None:
    """CTXPREC_LOG_LEVEL=debug|info|warning turns on stdlib logging to stderr, keys redacted."""
    level = os.environ.get("CTXPREC_LOG_LEVEL", "").strip().upper()
    if not level:
        return
    from connectors.judges.http import RedactingFilter

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ctxprec")
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging()
    commands = {"score": _cmd_score, "summary": _cmd_summary, "estimate": _cmd_estimate}
    try:
        return commands[args.command](args)
    except JudgeRefusedRunError as exc:
        print(
            f"ctxprec: the judge refused the run: {exc}. Finished parts are kept; run the same "
            "command again once this is fixed",
            file=sys.stderr,
        )
        return 4
    except CtxprecError as exc:
        print(f"ctxprec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "ctxprec: interrupted; finished parts are kept; run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    except JudgeError as exc:
        print(f"ctxprec: judge error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the last line of defence: a message, not a traceback
        if os.environ.get("CTXPREC_DEBUG"):
            traceback.print_exc()
        print(
            f"ctxprec: internal error: {type(exc).__name__}: {exc} "
            "(set CTXPREC_DEBUG=1 for the traceback; please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
