"""Which settings of an output folder's earlier run differ from this one, named as the flags a
user types (`--model: 'offline' there, 'openai/x' here`), for the "holds another run" refusal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["describe_differences"]

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
