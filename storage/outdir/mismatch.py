"""Which settings of an output folder's earlier run differ from this one, named as the flags a
user types (`--model: 'offline' there, 'openai/x' here`), for the "holds another run" refusal."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["added_columns", "describe_differences"]

_NAMES = {
    "input": "INPUT",
    "batch_rows": "--batch-rows",
    "judge_model": "--model",
    "mode": "--mode",
    "scale": "--scale",
    "ks": "--ks",
    "extractor": "--extractor",
    "partition_by": "--partition-by",
    "max_item_chars": "[run] max_item_chars",
    "schema_version": "output schema version",
}
_COLUMNS = ("--map id", "--map query", "--map expected", "--map context", "--map labels")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _pairs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b or key in ("files", "judge"):
            continue
        if key == "columns" and isinstance(a, list) and isinstance(b, list):
            names = [*_COLUMNS, "--passthrough"]
            out += [
                f"{n}: {_short(x)} there, {_short(y)} here"
                for n, x, y in zip(names, a, b, strict=False)
                if x != y
            ]
            continue
        out.append(f"{_NAMES.get(key, key)}: {_short(a)} there, {_short(b)} here")
    return out


_INPUT_KEYS = frozenset({"input", "files", "batch_rows"})  # which rows: not the configuration


def _outputs(columns: list[Any]) -> dict[str, str] | None:
    """A manifest's passthrough columns: source -> output name (None: not a column list)."""
    passthrough = columns[5] if len(columns) > 5 else None
    renames = columns[6] if len(columns) > 6 else []
    if not isinstance(passthrough, list) or not isinstance(renames, list):
        return None
    if not all(isinstance(p, str) for p in passthrough):
        return None
    pairs = {str(r[0]): str(r[1]) for r in renames if isinstance(r, list) and len(r) == 2}
    return {str(name): pairs.get(str(name), str(name)) for name in passthrough}


def added_columns(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str] | None:
    """The output columns `new` passes through that `old` did not, when that is all that
    differs between the two runs' configurations (the rows they read aside); None when
    anything else differs, a column is dropped or renamed, or nothing is added."""
    new = json.loads(json.dumps(new, default=str))  # as the manifest holds it
    for key in (set(old) | set(new)) - _INPUT_KEYS - {"columns"}:
        if old.get(key) != new.get(key):
            return None
    before, after = old.get("columns"), new.get("columns")
    if not isinstance(before, list) or not isinstance(after, list) or before[:5] != after[:5]:
        return None
    was, now = _outputs(before), _outputs(after)
    if was is None or now is None or any(now.get(k) != v for k, v in was.items()):
        return None
    added = [out for source, out in now.items() if source not in was]
    return added or None


def describe_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """One phrase naming every setting that differs, with both values."""
    out = _pairs(old, new)
    judge_old, judge_new = old.get("judge") or {}, new.get("judge") or {}
    same_model = old.get("judge_model") == new.get("judge_model")
    if same_model and judge_old != judge_new and isinstance(judge_old, dict):
        assert isinstance(judge_new, dict)
        out += [
            f"judge {k}: {_short(judge_old.get(k))} there, {_short(judge_new.get(k))} here"
            for k in sorted(set(judge_old) | set(judge_new))
            if judge_old.get(k) != judge_new.get(k) and k != "model"
        ]
    if old.get("files") != new.get("files") and old.get("input") == new.get("input"):
        out.append("the input files changed since (size, time or list of files)")
    return "; ".join(out) or "its recorded settings differ"
