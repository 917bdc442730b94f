"""`ctxprec view OUTDIR [OUTDIR_B] [--port N] [--host H]`: serve an output's report and its
whole row table (search, filters, sort, pages, each row's items; with two outputs the pairs
side by side) on a local web page until Ctrl-C. It reads local folders and object-store URIs
as `score` writes them and writes nothing anywhere.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import anyio

from ctxprec.run.interrupt import stoppable
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import out_path
from ctxprec.storage.outdir.status import unfinished
from ctxprec.storage.report.table import RowTable
from ctxprec.view import is_loopback, report_problem, serve

__all__ = ["run_view_command"]


def _started(outdirs: list[str], url: str) -> None:
    shown = " and ".join(outdirs)
    print(f"ctxprec view: {shown} at {url}  (Ctrl-C stops it)", flush=True)


def run_view_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    given = [args.outdir, *([args.outdir_b] if args.outdir_b else [])]
    outdirs = [out_path(str(o)) for o in given]
    tables = [RowTable(o) for o in outdirs]  # a folder that is no ctxprec output: exit 2
    for outdir in outdirs:
        if problem := report_problem(outdir):  # served only as a regular file of the output
            raise UserError(problem)
    for outdir in outdirs:
        if problem := unfinished(outdir):
            print(f"ctxprec view: note: {problem}; showing the rows committed so far",
                  file=sys.stderr)  # fmt: skip
    host = args.host or "127.0.0.1"
    loopback = is_loopback(host)
    if not loopback:
        print(
            f"ctxprec view: warning: serving on {host}, not on this machine only: anyone who "
            "can reach it can read these outputs (their queries, items and reasons)",
            file=sys.stderr,
        )
    run = partial(
        serve,
        tables,
        host,
        args.port,
        loopback_only=loopback,
        started=partial(_started, [str(o) for o in outdirs]),
        seams=seams,
    )
    try:
        anyio.run(stoppable, run)
    except KeyboardInterrupt:
        print("ctxprec view: stopped", file=sys.stderr)
        return 130
    return 0
