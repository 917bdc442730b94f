"""What `ctxprec --help` and argparse errors show: the parser class ("did you mean" for a mistyped
flag, no prefix matching), the default of every flag taken from the config defaults, and the
flag a user typed in place of an internal config path."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from pipeline.config import DEFAULTS

__all__ = ["Parser", "show_defaults"]

# dest -> (config key, how to say a default of None); flags without a config key say their own
_DEFAULT_OF: dict[str, tuple[str | None, str]] = {
    "model": ("judge.model", ""),
    "base_url": ("judge.base_url", "the provider's (OPENAI_BASE_URL / ANTHROPIC_BASE_URL)"),
    "api_key_env": ("judge.api_key_env", "OPENAI_API_KEY or ANTHROPIC_API_KEY by provider"),
    "mode": ("judge.mode", ""),
    "timeout": ("judge.timeout_s", ""),
    "max_retries": ("judge.max_retries", ""),
    "reason": ("scoring.reason", ""),
    "config": (None, "none: built-in defaults"),
    "extractor": ("columns.extractor", "none: the context column"),
    "passthrough": ("columns.passthrough", "none"),
    "batch_rows": ("run.batch_rows", ""),
    "concurrency": ("limits.concurrency", ""),
    "rpm": ("limits.rpm", "no limit"),
    "tpm": ("limits.tpm", "no limit"),
    "cache_dir": ("run.cache_dir", "the user cache dir (ctxprec cache info shows it)"),
    "scale": ("scoring.scale", ""),
    "ks": ("scoring.ks", ""),
    "group_by": ("output.group_by", "no grouping"),
    "partition_by": ("output.partition_by", "not partitioned"),
    "sink": ("output.sinks", "none"),
    "progress": (None, "auto"),
    "engine": (None, "local"),
    "scheduler": (None, "a local cluster"),
    "workers": (None, "one per core"),
}


def _default_text(dest: str) -> str | None:
    if dest == "map":
        c = {f: DEFAULTS[f"columns.{f}"] for f in ("id", "query", "expected", "context")}
        return ", ".join(f"{k}={v}" for k, v in c.items())
    if dest not in _DEFAULT_OF:
        return None
    key, none_text = _DEFAULT_OF[dest]
    value: Any = DEFAULTS.get(key) if key else None
    if value is None or value == []:
        return none_text or None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _argparse_default(action: argparse.Action) -> str | None:
    """A flag added elsewhere with a plain argparse default shows it too."""
    value = action.default
    if value in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: ...)" to the help of every flag whose default is known."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                show_defaults(sub)
            continue
        text = _default_text(action.dest) or _argparse_default(action)
        helped = action.help and action.help is not argparse.SUPPRESS
        if text and helped and "default" not in str(action.help):
            action.help = f"{action.help} (default: {text})"


class Parser(argparse.ArgumentParser):
    """No abbreviations (`--partition` is not `--partition-by`) and a suggestion for a typo."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _all_flags(self) -> list[str]:
        flags = [s for a in self._actions for s in a.option_strings]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, Parser):
                        flags += sub._all_flags()
        return sorted(set(flags))

    def error(self, message: str) -> NoReturn:
        unknown = re.search(r"unrecognized arguments: (.*)", message)
        if unknown:
            hints = []
            for arg in unknown.group(1).split():
                if not arg.startswith("--"):
                    continue
                close = difflib.get_close_matches(arg.split("=")[0], self._all_flags(), n=1)
                if close:
                    hints.append(f"{arg}: did you mean {close[0]}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)
