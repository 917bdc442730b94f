"""What state an output folder is in, in words for `ctxprec summary`: finished, interrupted (and
how to resume it), being written by a live run, or not a ctxprec output at all.
"""

from __future__ import annotations

from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir.lock import damaged_lock, live_holder
from ctxprec.storage.outdir.ownership import read_manifest, records

__all__ = ["unfinished"]


def unfinished(outdir: OutPath) -> str | None:
    """Why `outdir` has no finished run to summarise; None when it has one."""
    manifest = read_manifest(outdir)
    run = layout.run_info(outdir)
    if manifest is None:
        return (
            f"{outdir} holds no ctxprec run (no {run}); pass an OUTDIR written by `ctxprec score`"
        )
    holder = live_holder(outdir)
    if holder is not None:
        return (
            f"{outdir} is being written by a ctxprec run right now ({holder.describe()}); "
            "run `ctxprec summary` again once it has finished"
        )
    if damaged := damaged_lock(outdir):
        return (
            f"{outdir} is locked by {damaged}: a run may be writing it; run `ctxprec summary` "
            "again once no run is, or remove the lock file if none is (a lock nobody touches "
            "is stale after two minutes)"
        )
    if manifest.get("status") == "complete" and run.is_file():
        return None
    done = records(outdir)
    rows = sum(int(r.get("rows", 0)) for r in done.values())
    described = manifest.get("describe", {})
    command = manifest.get("command")
    again = f": `{command}`" if command else ""
    return (
        f"{outdir} holds an interrupted ctxprec run (stopped by Ctrl-C, a kill or a crash) of "
        f"input {described.get('input')!r} with judge {described.get('judge_model')!r}: "
        f"{rows} rows in {len(done)} committed parts so far. To resume it, run the same "
        f"`ctxprec score` command again{again}; finished parts are kept and no finished judge "
        "call is repeated"
    )
