"""What `ctxprec --help` and argparse errors show: the parser class ("did you mean" for a mistyped
flag, no prefix matching), the default of every flag taken from the settings' fields
(storage/core/settings.py), and the flag a user typed in place of an internal config path."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from ctxprec.storage.core.settings import ColumnMap, settings

__all__ = ["Parser", "default_text", "show_defaults"]

# flags that set no config key: how to say their default
_OTHER_DEFAULTS = {
    "config": "none: built-in defaults",
    "progress": "auto",
    "engine": "local",
    "scheduler": "a local cluster",
    "workers": "one per core",
}
_SETTINGS = {s.key: s for s in settings()}


def default_text(key: str) -> str | None:
    """A setting's default as `--help` says it, read off its field (storage/core/settings.py);
    None for switches (--no-memo, --batch-api), whose help says what they do."""
    s = _SETTINGS[key]
    value: Any = s.default
    if isinstance(value, bool):
        return None
    if value is None or value == ():
        return s.unset or "none"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default_text(dest: str) -> str | None:
    if dest == "map":
        c = ColumnMap()
        return ", ".join(f"{f}={getattr(c, f)}" for f in ("id", "query", "expected", "context"))
    if dest in _SETTINGS:
        return default_text(dest)
    return _OTHER_DEFAULTS.get(dest)


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
