"""The `ctxprec` command: `score`, `estimate`, `summary`, `compare`, `view`, `batches`, `cache`,
`providers`, `config` and `sample`. Exit codes:
0 all rows scored; 1 some rows failed (output still written); 2 usage/config/input/output-folder
errors before any judge call (a folder ctxprec did not write, one another run is writing, an
object-store URL, a sink without its extra) or a write that failed mid-run (full disk, read-only
folder); 3 an internal error; 5 a quality gate failed (--fail-under, --fail-drop; 1 wins when rows
failed too); 4 the judge refused the run (auth, quota, unknown model, a request it
rejects that cannot be adapted: finished parts kept, the same command resumes once fixed);
6 provider batches still pending after --batch-wait (the same command collects
them later); 7 a quality gate had nothing to judge (no scored row: --pass-empty lets it
pass); 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM (finished parts and verdicts kept; the
same command resumes). A reader that
closes stdout early (`ctxprec summary OUT | head`) is normal use: nothing more is printed and the
command exits 0, never an error.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ctxprec.cli.cache import add_cache_command
from ctxprec.cli.config import add_config_command, example_configs
from ctxprec.cli.help import Parser, show_defaults
from ctxprec.cli.process import INTERRUPTED, leave
from ctxprec.cli.providers import add_providers_command
from ctxprec.cli.sample import add_sample_command
from ctxprec.cli.streams import GuardedStream
from ctxprec.config import FLAGS, Config, column_map_flags, env_setting, flag_type, load_config
from ctxprec.connectors.judges.secrets import RedactingFilter
from ctxprec.run.interrupt import Stop
from ctxprec.storage.core.errors import (
    BatchesPendingError,
    ConfigError,
    CtxprecError,
    JudgeError,
    JudgeRefusedRunError,
    UserError,
)
from ctxprec.storage.core.options import BatchOptions, CompareOptions
from ctxprec.storage.core.printable import printable, shown
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import settings
from ctxprec.version import __version__

__all__ = ["COMMANDS", "OutdirArg", "build_parser", "main"]

# Subcommand -> "module:function" running it, imported only when that command runs: `--version`,
# `--help` and a mistyped command load no Polars, aiohttp, Dask or judge (docs/performance.md,
# start-up). A new subcommand adds its parser in `build_parser` and one line here; its code and
# its heavy imports live in that module. tests/test_layers.py checks every target like an import.
# Each is called as `function(args, seams)` (`main`'s seams; most commands touch none of them).
COMMANDS: dict[str, str] = {
    "score": "ctxprec.cli.commands:cmd_score",
    "summary": "ctxprec.cli.commands:cmd_summary",
    "estimate": "ctxprec.cli.commands:cmd_estimate",
    "compare": "ctxprec.cli.commands:cmd_compare",
    "batches": "ctxprec.cli.commands:cmd_batches",
    "cache": "ctxprec.cli.cache:run_cache_command",
    "providers": "ctxprec.cli.providers:run_providers_command",
    "config": "ctxprec.cli.config:run_config_command",
    "sample": "ctxprec.cli.sample:run_sample_command",
    "view": "ctxprec.cli.view:run_view_command",
}

SETTINGS = {s.key: s for s in settings()}


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
    for key in (
        "model", "base_url", "api_key_env", "mode", "verdict_only", "timeout_s", "max_retries",
        "retry_budget_s",
    ):  # fmt: skip
        _add_setting(g, f"judge.{key}")
    _add_setting(g, "scoring.reason")
    _add_setting(g, "run.recheck")  # score runs it, estimate prices it
    a = p.add_argument_group("audit judge (a stronger judge on a sample of rows)")
    for key in ("audit_model", "audit_fraction", "audit_seed", "audit_base_url"):
        _add_setting(a, f"judge.{key}")


def _add_data_flags(p: argparse.ArgumentParser, *, output: bool = False) -> None:
    g = p.add_argument_group("input and output" if output else "input")
    g.add_argument(
        "input",
        help="a Parquet, JSON Lines (.jsonl/.ndjson/.json) or CSV file (text formats also .gz or "
        ".zst), a folder or glob of them, or a Hive-partitioned dataset; a path or an s3:// "
        "gs:// az:// URL",
    )
    if output:
        g.add_argument("-o", "--output", required=True, type=_outdir, help="output folder or URI")
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
    for key in ("columns.extractor", "columns.passthrough", "columns.duplicate_ids",
                "run.batch_rows"):  # fmt: skip
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


def _add_lock_flag(p: Any) -> None:
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


def _add_tracking_flags(p: argparse.ArgumentParser, *, otel: bool) -> None:
    """--mlflow [EXPERIMENT] (and --otel for score): where the results are also tracked."""
    g = p.add_argument_group("tracking (docs/tracking.md)")
    _add_setting(g, "mlflow.enabled", action="store", nargs="?", const=True,
                 metavar="EXPERIMENT")  # fmt: skip
    if otel:
        _add_setting(g, "otel.enabled")


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
        default=BatchOptions().fallback,
        help="where lines that expired or errored go again: new batches (default) or online",
    )


SCORE_EPILOG = """examples:
  ctxprec score logs.parquet -o out/night           the offline judge, no key needed
  ctxprec score logs/ -o out/night --model openai/gpt-4o-mini --map query=question
  ctxprec score 'logs/dt=*/' -o out/all --incremental --partition-by dt

exit codes:
  0 every row scored; 1 some rows failed (output written; the summary says which a re-run can
  fix); 2 usage, config, input or output-folder error before any judge call; 3 internal error;
  4 the judge refused the run (auth, quota, model, a dead base URL, a judge that never gives
  a verdict); 5 a quality gate failed (--fail-under: the input's scored rows, the same answer
  on a retry); 6 provider batches still pending (--batch-wait); 7 the gate had no scored row to
  judge (--pass-empty: pass); 130 Ctrl-C, 143 SIGTERM (finished parts and verdicts kept: the
  same command resumes)"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ctxprec",
        description="Context precision (MAP) of retrieved context, judged item by item, over "
        "Parquet, JSON Lines and CSV (files, folders, globs, object stores).",
    )
    parser.add_argument("--version", action="version", version=f"ctxprec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser(
        "score",
        help="score a dataset into OUTDIR",
        epilog=SCORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_flags(sc, output=True)
    _add_judge_flags(sc)
    out = sc.add_argument_group("output")
    _add_setting(out, "output.partition_by")
    _add_setting(out, "output.charts")
    _add_setting(out, "output.sinks", action="append")
    out.add_argument("--overwrite", action="store_true", help="replace what OUTDIR holds")
    out.add_argument("--incremental", action="store_true", help="add new ids to an existing OUTDIR")
    _add_lock_flag(out)
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
    _add_tracking_flags(sc, otel=True)
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
    add_sample_command(sub)
    _add_gate_flags(sc)
    _add_compare_parser(sub)
    bt = sub.add_parser("batches", help="list (or cancel) the provider batches of an OUTDIR")
    bt.add_argument("outdir", type=_outdir, help="an output folder of a `score --batch-api` run")
    bt.add_argument("--cancel", action="store_true", help="cancel the batches still running")
    bt.add_argument("--json", action="store_true", help="print JSON")
    bt.add_argument(
        "--config",
        type=Path,
        help="the TOML config file of the score run (its [judge] and [providers] say where the "
        "batches are; OUTDIR's state is never followed for that)",
    )
    bj = bt.add_argument_group("judge (as the score run was given it)")
    for key in ("model", "base_url", "api_key_env", "timeout_s", "audit_model", "audit_base_url"):
        _add_setting(bj, f"judge.{key}")
    add_providers_command(sub)  # `ctxprec providers` (pipeline/cli/providers.py)
    _add_view_parser(sub)
    show_defaults(parser)
    for action in es._actions:  # accepted only to be refused with a reason (see below)
        if action.dest in _NOT_FOR_ESTIMATE:
            action.help = argparse.SUPPRESS
    return parser


class OutdirArg(str):
    """An OUTDIR argument as given: a local folder, or an s3:// gs:// az:// abfs[s]:// file://
    URI. The command turns it into a path (`ctxprec.storage.files.objpath.out_path`) before it runs,
    so that parsing the command line loads no storage library."""


def _outdir(text: str) -> Any:
    return OutdirArg(text)


VIEW_PORT = 8765
VIEW_EPILOG = """examples:
  ctxprec view out/night                 http://127.0.0.1:8765/ until Ctrl-C
  ctxprec view out/night out/cheap       both outputs, and their rows paired by id
  ctxprec view s3://bucket/scores --port 0     any free port (the URL is printed)"""


def _add_view_parser(sub: Any) -> None:
    vw = sub.add_parser(
        "view",
        help="serve an output's report and every row on a local web page (read only)",
        epilog=VIEW_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vw.add_argument(
        "outdir", type=_outdir, metavar="OUTDIR", help="an output folder or URI written by `score`"
    )
    vw.add_argument(
        "outdir_b",
        nargs="?",
        type=_outdir,
        metavar="OUTDIR_B",
        help="a second output: its rows too, and the two paired by id (scores, B - A, items)",
    )
    vw.add_argument(
        "--port",
        type=_port,
        default=VIEW_PORT,
        help="TCP port (0: any free one; the URL printed says which)",
    )
    vw.add_argument(
        "--host",
        help="address to listen on (default: 127.0.0.1, this machine only); another address "
        "serves the outputs to anyone who can reach it, with a warning",
    )


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return int(text)


def _add_gate_flags(p: argparse.ArgumentParser) -> None:
    _add_setting(p, "gate.fail_under")
    _add_setting(p, "gate.pass_empty")


def _add_compare_parser(sub: Any) -> None:
    cp = sub.add_parser("compare", help="paired comparison of two outputs, or two slices of one")
    cp.add_argument("outputs", nargs="+", metavar="OUTDIR", help="A B, or one OUTDIR with --a/--b")
    cp.add_argument("--a", action="append", default=[], metavar="COL=VALUE", help="rows of A")
    cp.add_argument("--b", action="append", default=[], metavar="COL=VALUE", help="rows of B")
    d = CompareOptions()  # every default once, there
    cp.add_argument("--on", default=d.on, metavar="COL", help=f"column pairing rows ({d.on})")
    cp.add_argument("--group-by", metavar="COL", help="deltas per value of COL")
    cp.add_argument("--resamples", type=int, default=d.resamples, help="bootstrap resamples")
    cp.add_argument("--seed", type=int, default=d.seed, help="bootstrap seed")
    cp.add_argument("--top", type=int, default=d.top, help="rows that changed most to show")
    cp.add_argument("--strict", action="store_true", help="refuse sides with different judges")
    cp.add_argument("--fail-drop", type=float, metavar="X", help="exit 5 when B is worse by > X "
                    "(exit 7 when there is nothing to compare)")  # fmt: skip
    cp.add_argument("--pass-empty", action="store_true", help="with --fail-drop: nothing to "
                    "compare (an empty night) passes instead of exiting 7")  # fmt: skip
    # -- honest intervals: clustered bootstrap and non-inferiority
    cp.add_argument("--cluster-by", metavar="COL", help="resample pairs sharing COL together "
                    "(default: the query column when several pairs share a query)")  # fmt: skip
    cp.add_argument("--margin", type=float, metavar="X", help="test that B is no worse than A "
                    "by more than X; with --fail-drop, exit 5 unless shown")  # fmt: skip
    cp.add_argument("-o", "--output", type=Path, help="write compare.json/.md/.png into DIR")
    cp.add_argument("--json", action="store_true", help="print compare.json to stdout")
    _add_tracking_flags(cp, otel=False)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted key: value} of every setting given on the command line (argparse dests are the
    keys); `--map FIELD=COLUMN` sets [columns] FIELD."""
    flags = {k: v for k, v in vars(args).items() if k in SETTINGS and v not in (None, [])}
    try:
        flags.update(column_map_flags(list(getattr(args, "map", None) or []), "command line"))
    except ConfigError as exc:  # the CLI's usage error, as before the loader took maps
        raise UserError(str(exc)) from None
    if isinstance(experiment := flags.get("mlflow.enabled"), str):  # --mlflow EXPERIMENT
        flags |= {"mlflow.enabled": True, "mlflow.experiment": experiment}
    return flags


def _check_conflicts(args: argparse.Namespace) -> None:
    if getattr(args, "overwrite", False) and getattr(args, "incremental", False):
        raise UserError("--overwrite and --incremental contradict each other; pick one")
    if getattr(args, "wait_lock", 0.0) < 0:
        raise UserError(f"--wait-lock {args.wait_lock:g}: give a number of seconds, 0 or more")
    if getattr(args, "quiet", False) and args.progress in ("bar", "log"):
        raise UserError(f"--quiet and --progress {args.progress} contradict each other")


def _config(args: argparse.Namespace) -> Config:
    _check_conflicts(args)
    cfg = load_config(getattr(args, "config", None), _flags(args))
    _setup_logging(cfg.run.log_level)  # a config file's [run] log_level and debug count too
    args.debug = cfg.run.debug
    return cfg


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
        "judge.retry_budget_s",
        "scoring.reason",
        "run.batch_rows",
    )
}


def _setup_logging(log_level: str | None) -> None:
    """[run] log_level (CTXPREC_LOG_LEVEL) debug|info|warning turns on stdlib logging to
    stderr, keys redacted; set again, it replaces the handler it set before."""
    root = logging.getLogger("ctxprec")
    for old in [h for h in root.handlers if isinstance(h, _LogHandler)]:
        root.removeHandler(old)
    level = (log_level or "").strip().upper()
    if not level:
        return
    handler = _LogHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))


class _LogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `_setup_logging` adds (and replaces)."""


BROKEN_PIPE_EXIT = 0  # a reader that left early (`| head`) is normal use, not a failure of ours


def _for_stdout(text: str) -> str:
    return shown(text, "\n\t")


def _for_stderr(text: str) -> str:  # the progress bar redraws its line with \r
    return shown(text, "\n\t\r")


Command = Callable[[argparse.Namespace, Seams], int]


def _command(name: str) -> Command:
    module, _, function = COMMANDS[name].partition(":")
    loaded = sys.modules.get(module) or _load_frozen(module)
    run: Command = getattr(loaded, function)
    return run


def _load_frozen(module: str) -> Any:
    """Import a command's module with the cyclic collector paused, then freeze what exists
    (`gc.freeze`: later collections skip it). Polars, PyArrow, aiohttp and ctxprec's own modules
    make ~500,000 objects that live until exit: with the collector on, ~180 collections walked
    them while they loaded (one of them full), and merely pausing it would leave them all young
    for the next collection to walk. Paused and frozen, a command's imports cost ~40 ms less
    CPU. What an import leaves in a cycle stays until exit, like the modules themselves."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        loaded = importlib.import_module(module)
        gc.freeze()
    finally:
        if collecting:
            gc.enable()
    return loaded


def one_blas_thread() -> None:
    """ctxprec multiplies no matrices, yet NumPy (PyArrow imports it) loads OpenBLAS, which
    starts a thread per core that busy-waits for work once loaded: ~0.1 s of CPU per process on
    two cores, more than the client work of a few hundred judge calls. One thread, unless the
    user set OPENBLAS_NUM_THREADS; it must be set before NumPy is first imported, which a
    command's own modules do (`_command`)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None, *, seams: Seams = DEFAULT) -> int:
    """The `ctxprec` command. What it prints has its control characters escaped; a reader that
    closes stdout early (`| head`) ends the printing quietly, never the command's exit code.
    `seams` (storage/core/seams.py) is what the command's runs use for their judges' retry
    clock, transport and keys, sizes and fault hook: the real ones unless a test passes its own."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = GuardedStream(out, _for_stdout), GuardedStream(err, _for_stderr)
    try:
        return _guarded_main(argv, seams)
    finally:
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe is noise
        sys.stdout, sys.stderr = out, err


def _guarded_main(argv: Sequence[str] | None, seams: Seams) -> int:
    one_blas_thread()
    Stop.reset()
    try:
        before = Stop.install()
    except ValueError:  # not the main thread (main() called from a thread): Python's handlers
        before = {}
    try:
        try:
            code = _main(argv, seams)
        except KeyboardInterrupt:  # a stop while the command line is still being parsed
            code = _interrupted()
    except BrokenPipeError:  # written past the guard (a raw descriptor): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = BROKEN_PIPE_EXIT
    if Stop.signum is None:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        Stop.reset()
    # else: a stopped command keeps ignoring signals until the process ends
    return 143 if code == 130 and Stop.signum == signal.SIGTERM else code


def _interrupted() -> int:
    print(INTERRUPTED, file=sys.stderr)
    return 130


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The subparser of `command` (the top-level parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser


def _main(argv: Sequence[str] | None, seams: Seams) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's own usage and its close flags, not the top level's
        command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.debug = False
    try:
        # before any config file: from the environment, checked by the loader
        _setup_logging(env_setting("run.log_level"))
        args.debug = env_setting("run.debug")
        return _command(args.command)(args, seams)
    except BatchesPendingError as exc:
        print(f"ctxprec: {printable(str(exc), lines=True)}", file=sys.stderr)
        if getattr(args, "quiet", False):  # cron logs get their one JSON line
            print(json.dumps({"outdir": str(args.output), "batches_pending": str(exc)}))
        return exc.exit_code
    except JudgeRefusedRunError as exc:
        print(
            f"ctxprec: {exc.lead}: {printable(str(exc), lines=True)}. Finished "
            "parts are kept; run the same command again once this is fixed",
            file=sys.stderr,
        )
        return exc.exit_code
    except UserError as exc:
        print(f"ctxprec: error: {printable(str(exc), lines=True)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except JudgeError as exc:
        print(f"ctxprec: judge error: {printable(str(exc), lines=True)}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        raise  # the reader of stdout left: `main` ends quietly
    except Exception as exc:  # the last line of defence: a message, not a traceback
        if args.debug:
            traceback.print_exc()
        print(
            f"ctxprec: internal error: {type(exc).__name__}: {printable(str(exc), lines=True)} "
            "(set CTXPREC_DEBUG=1 for the traceback; please report it)",
            file=sys.stderr,
        )
        return CtxprecError.exit_code  # not one of ours, or a bug: 3


if __name__ == "__main__":
    sys.exit(leave(main()))
