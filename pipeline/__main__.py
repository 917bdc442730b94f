"""The `ctxprec` command: the console script's entry and `python -m ctxprec`.

Its first lines hold SIGINT and SIGTERM, so a stop during the imports that follow ends the
command as a stop does later (the resume line, 130 / 143) instead of a traceback: the C module
`_signal` (`signal` would import `enum` first) records a stop until
`ctxprec.cli.process.hold_signals` is loaded, which then acts on it. Before these lines only
the interpreter's start-up and the package's `__init__` (which imports nothing) run. `--version`
is answered without building the parser; every other command loads `ctxprec.cli.main` (named in
`_LOADS`, the table tests/test_layers.py checks like an import) and the process ends without the
interpreter's teardown (`ctxprec.cli.process.leave`). Nothing in ctxprec imports this module.
"""

import _signal  # type: ignore[import-not-found]  # (C; typeshed has no stub)

_EARLY: list[int] = []  # a stop that came while ctxprec.cli.process was loading
for _sig in (_signal.SIGINT, _signal.SIGTERM):
    _signal.signal(_sig, lambda signum, frame: _EARLY.append(signum))

from ctxprec.cli.process import hold_signals, leave, release_signals  # noqa: E402

hold_signals(_EARLY)

import importlib  # noqa: E402 - after the signals are held
import sys  # noqa: E402

from ctxprec.version import __version__  # noqa: E402

__all__ = ["main"]

# name -> "module:attribute" loaded on first use: the parser and its subcommands are not needed
# to print the version
_LOADS = {"cli": "ctxprec.cli.main:main"}


def main() -> int:
    hold_signals()  # again: a caller may have changed them after this module was imported
    if sys.argv[1:] == ["--version"]:  # what argparse prints, without building the parser
        print(f"ctxprec {__version__}")
        return 0
    module, _, name = _LOADS["cli"].partition(":")
    code: int = getattr(importlib.import_module(module), name)()
    release_signals()
    return leave(code)


if __name__ == "__main__":
    sys.exit(main())
