"""Reading back ctxprec's own JSON state from OUTDIR, which anyone with write access to the
folder may have changed: each file is read through no link, up to a size cap, and checked
against a fixed schema (types, ranges) before any of it is used. A damaged file is one
OutputError naming it and the way out; nothing is changed before that.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxprec.storage.core.errors import StateDamagedError
from ctxprec.storage.files import confine
from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "BATCH_STATE_CAP",
    "COMMIT_RECORD",
    "ESTIMATE",
    "MANIFEST",
    "RECORD",
    "REPORT_TEXTS",
    "RUN_INFO",
    "SINK_RECORD",
    "Spec",
    "damaged",
    "opt",
    "read_bytes",
    "read_json",
]

# caps: far above what a run writes, far below what would exhaust memory
MANIFEST_CAP = 64 << 20  # the manifest lists every input file
RUN_INFO_CAP = 64 << 20  # one history line per run
SMALL_CAP = 16 << 20  # estimate, records, sink records
BATCH_STATE_CAP = 512 << 20  # one entry per chunk and per item a batch could not answer
IDS_CAP = 512 << 20  # a chunk's custom_id -> memo keys map


def damaged(path: OutPath, why: str, fix: str) -> StateDamagedError:
    return StateDamagedError(f"{path} is damaged ({why}); nothing was changed: {fix}")


def read_bytes(outdir: OutPath, path: OutPath, cap: int, fix: str) -> bytes | None:
    """The bytes of one state file (None when there is none), read through no link and never
    more than `cap` bytes."""
    confine.check_inside(outdir, path)
    if isinstance(path, ObjPath):
        if not path.exists():
            return None
        if not confine.is_regular(path):
            raise damaged(path, "not a regular file", fix)
        if path.stat().st_size > cap:
            raise damaged(path, f"larger than {cap >> 20} MiB", fix)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise damaged(path, f"unreadable: {exc.strerror or exc}", fix) from None
    try:
        return confine.read_regular(path, cap)
    except ValueError as exc:
        raise damaged(path, str(exc), fix) from None
    except OSError as exc:
        raise damaged(path, f"unreadable: {exc.strerror or exc}", fix) from None


def read_json(outdir: OutPath, path: OutPath, spec: Spec, fix: str) -> Any:
    """One JSON state file checked against `spec`; None when there is none."""
    data = read_bytes(outdir, path, spec.cap, fix)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text", fix) from None
    except RecursionError:
        raise damaged(path, "nested too deeply", fix) from None
    except ValueError:
        raise damaged(path, "not JSON" if data.strip() else "empty", fix) from None
    problem = spec.problem(value)
    if problem:
        raise damaged(path, problem, fix)
    return value


# -- schemas ---------------------------------------------------------------------------------
# A type is a name: "str", "num" (int or finite float, not bool), "int" (>= 0), "bool", "any";
# "?x" also allows null; a dict is an object whose listed keys (all optional unless in
# `required`) have those types ("*": every value); a one-item list is a list of that type;
# opt(x) is x or null.
Type = str | dict[str, Any] | list[Any] | tuple[Any, ...]


def opt(kind: Type) -> tuple[str, Type]:
    return ("?", kind)


_MAX_DEPTH = 12


def _is_num(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "num": _is_num,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63,
    "bool": lambda v: isinstance(v, bool),
    "any": lambda v: True,
}


def _problem(value: Any, kind: Type, where: str, depth: int = 0) -> str | None:
    if depth > _MAX_DEPTH:
        return f"{where or 'the file'} is nested too deeply"
    if isinstance(kind, tuple):
        return None if value is None else _problem(value, kind[1], where, depth)
    if isinstance(kind, str):
        if kind.startswith("?"):
            if value is None:
                return None
            kind = kind[1:]
        if _CHECKS[kind](value):
            return None
        want = {"num": "a number", "int": "a whole number >= 0", "str": "a string"}
        return f"{where or 'the file'} is {_shown(value)}, not {want.get(kind, kind)}"
    if isinstance(kind, list):
        if not isinstance(value, list):
            return f"{where or 'the file'} is {_shown(value)}, not a list"
        for i, item in enumerate(value):
            if (found := _problem(item, kind[0], f"{where}[{i}]", depth + 1)) is not None:
                return found
        return None
    if not isinstance(value, dict):
        return f"{where or 'the file'} is {_shown(value)}, not an object"
    if "*" in kind:
        for key, item in value.items():
            if (found := _problem(item, kind["*"], f"{where}.{key}", depth + 1)) is not None:
                return found
    for key, sub in kind.items():
        if key in value:
            found = _problem(value[key], sub, f"{where}.{key}" if where else key, depth + 1)
            if found is not None:
                return found
    return None


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "a string" if isinstance(value, str) else "a number"


@dataclass(frozen=True)
class Spec:
    """The schema of one kind of state file: its fields' types, required keys, size cap."""

    fields: dict[str, Any]
    required: tuple[str, ...] = ()
    cap: int = SMALL_CAP
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def problem(self, value: Any) -> str | None:
        found = _problem(value, self.fields, "")
        if found is not None:
            return found
        missing = [key for key in self.required if key not in value]
        if missing:
            return f"no {missing[0]!r}"
        for key, allowed in self.choices.items():
            if key in value and value[key] not in allowed:
                return f"{key} is not one of {', '.join(map(repr, allowed))}"
        return None


MANIFEST = Spec(
    {
        "fingerprint": "str",
        "config_fingerprint": "str",
        "status": "str",
        "incremental": "bool",
        "command": "?str",
        "describe": {
            "input": "?str",
            "judge_model": "?str",
            "scale": "num",
            "ks": ["int"],
            "partition_by": ["str"],
        },
    },
    cap=MANIFEST_CAP,  # a field missing reads as another run (refused), never as this one
    choices={"status": ("running", "complete")},
)

_NUMS = (
    "wall_s", "rows_this_run", "rows_skipped", "items_this_run", "judge_calls", "calls_failed",
    "memo_hits", "dedup_hits", "reason_calls", "concurrency", "rpm", "tpm",
)  # fmt: skip
_PRICE = {"input_per_mtok": "?num", "output_per_mtok": "?num", "cached_input_per_mtok": "?num"}
_JUDGE = {
    k: "?num"
    for k in (
        "input_tokens", "output_tokens", "cached_input_tokens", "requests", "calls", "retries",
        "rate_limited", "row_fallbacks", "usage_unknown",
    )
} | {"adaptations": "?any"}  # fmt: skip
_HISTORY = {
    **{k: "?num" for k in (*_NUMS, "input_tokens", "output_tokens", "cached_input_tokens")},
    "started_at": "?str", "finished_at": "?str", "incremental": "?bool", "engine": "?str",
    "price": opt(_PRICE),
}  # fmt: skip

ESTIMATE_FIELDS: dict[str, Any] = {
    **{
        k: "?num"
        for k in (
            "rows", "rows_to_judge", "rows_already_scored", "context_items", "memo_hits",
            "calls", "input_tokens", "output_tokens", "cost_usd", "wall_s",
        )
    },
    "judge_model": "?str",
    "batch_api": opt({"*": "any"}),
}  # fmt: skip
ESTIMATE = Spec(ESTIMATE_FIELDS)

RUN_INFO = Spec(
    {
        **{k: "?num" for k in _NUMS},
        **{k: "?str" for k in ("started_at", "finished_at", "input", "judge_model")},
        "prompt_version": "?str",
        "group_by": "?str",
        "incremental": "?bool",
        "judge": opt(_JUDGE),
        "gate": "?any",  # run.json before the throttle had its name
        "throttle": "?any",
        "price": opt(_PRICE),
        "engine": opt({"name": "?str", "batch_api": "?any"}),
        "notices": opt(["str"]),
        "sinks": opt([{"sink": "?str", "files": "?num", "rows_added": "?num"}]),
        "sink_errors": opt(["str"]),
        "estimate": opt(ESTIMATE_FIELDS),
        "history": opt([_HISTORY]),
        "recheck": "?any",
        "quality_gate": "?any",
        "duplicate_ids": opt({"policy": "?str", "ids": "?num", "rows_dropped": "?num"}),
        "tokens": opt({"*": "?num"}),
        "cost_usd": opt({"*": "?num"}),
    },
    cap=RUN_INFO_CAP,
)

RECORD = Spec(
    {"key": "str", "files": ["str"], "rows": "int", "failed": "int"}, required=("key", "files")
)
# what a record keeps of each of its files (`ctxprec.storage.outdir.partcheck`); records written
# before these checks have none, and are checked by what they carry
_FILE_CHECKS = {"bytes": "int", "rows": "int", "crc32": "str", "schema": "str"}
COMMIT_RECORD = Spec(
    {**RECORD.fields, "checks": {"*": _FILE_CHECKS}}, required=("key", "files", "rows", "failed")
)
SINK_RECORD = Spec({"sink": "?str", "loaded": {"*": "int"}}, required=("loaded",))
# id -> the texts of a row summary.html opened (`ctxprec.storage.report.rows.Texts`)
REPORT_TEXTS = Spec(
    {"texts": {"*": {"query": "?str", "expected": "?str", "context": opt(["?str"])}}},
    required=("texts",),
    cap=MANIFEST_CAP,
)
