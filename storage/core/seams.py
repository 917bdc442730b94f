"""The seams of a run: what a test (or a program embedding ctxprec) may replace, in one object.

httpx takes a `transport=`; ctxprec takes `seams=`. Production code uses `DEFAULT`, whose every
field means "the real thing"; a test builds its own (`Seams(clock=instant_retries())`,
`dataclasses.replace(DEFAULT, memo_wait=3600.0)`) and passes it where the run starts:
`ctxprec.cli.main(argv, seams=)`, `RunOptions(seams=)`, `create_judge(settings, seams=)`.
From there it travels in the objects a run already passes around (`RunOptions` -> `RunPlan` ->
the stages, judges and engines), never in module globals and never in the argparse Namespace.

    clock        waits between a judge's HTTP attempts (`connectors.judges.retry.RetryClock`;
                 None: real waits). An instant one only advances a virtual offset.
    transport    the HTTP judges' transport (`connectors.judges.transport.Transport`; None: an
                 aiohttp one per judge). A transport passed in is the caller's to close.
    keys         where a judge's API key is read, by variable name (None: the environment).
    memo_wait    seconds the memo writer waits to gather a bigger write (`flow.dispatch`).
    plan_part_chars  request text a keyed-engine planning task holds before writing it out.
    lock_settle_s    object stores: how long a new lease must stay ours before it counts.
    view_header_s    `ctxprec view`: seconds a connection may take to send its request's head
                 (after it opens, or after its last reply) before it is closed.
    view_connections  `ctxprec view`: connections open at once, at most (more get a 503).
    fault        a hook called at named points of a run (`FAULT_POINTS`) with what is being
                 done there; it may raise (a kill, a full disk) or act (leave litter beside).

A Dask task on another machine gets `for_workers()`: the sizes, not this process's objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DEFAULT", "FAULT_POINTS", "Clock", "FaultHook", "KeySource", "Seams"]


class Clock(Protocol):
    """What a judge's retry loop needs of a clock (`connectors.judges.retry.RetryClock`)."""

    rand: Callable[[], float]  # the jitter draw

    def now(self) -> float: ...
    def sleep(self, seconds: float) -> Awaitable[None]: ...


KeySource = Callable[[str], str | None]  # variable name -> its value (None: not set)

# point -> what the hook is given there
FAULT_POINTS = {
    "config": "the Config a command has just loaded (its log level and debug flag in force)",
    "commit": "the part key, before the stage commits a part (`storage.outdir.commit.commit_part`)",
    "part_write": "the target Path, before each part file's atomic write in a commit",
    "finish": "the output folder, before the driver writes the summary, run.json and _SUCCESS",
    "tasks": "the output folder, when the Dask engine's driver starts the run on the cluster",
    "sink_batch": "the batch's index, before a sink takes each batch of the run's parts",
    "sink_held": "the ids an Iceberg table holds already, read just before its commit",
}
FaultHook = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True)
class Seams:
    clock: Clock | None = None
    transport: Any = None  # a connectors.judges.transport.Transport (a layer above this one)
    keys: KeySource | None = None
    memo_wait: float = 2.0
    plan_part_chars: int = 32_000_000
    lock_settle_s: float = 1.0
    sink_id_filter: int = 10_000  # ids an Iceberg sink pushes into its scan, at most
    view_header_s: float = 10.0
    view_connections: int = 64
    fault: FaultHook | None = None

    def at(self, point: str, subject: Any = None) -> None:
        """Call the fault hook at `point` (one of `FAULT_POINTS`), if there is one."""
        if self.fault is not None:
            self.fault(point, subject)

    def for_workers(self) -> Seams:
        """The seams a task on another process or machine gets: the sizes and timings; this
        process's clock, transport, key source and hook stay here (each worker's judges wait on
        real time and read their keys from their own environment)."""
        return dataclasses.replace(self, clock=None, transport=None, keys=None, fault=None)


DEFAULT = Seams()
