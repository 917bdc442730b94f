"""`[run] extractor = "module:function"`: the user's function that builds a row's context items,
loaded by name (an importable module or a path to a .py file), with a clear error when it is not
there.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import ConfigError

__all__ = ["Extractor", "load_extractor"]

Extractor = Callable[[dict[str, Any]], Any]


def load_extractor(spec: str) -> Extractor:
    """Import "module:function"; a clear ConfigError when it is not there."""
    module_name, _, attr = spec.rpartition(":")
    try:
        fn = getattr(_import(module_name), attr)
    except (ImportError, AttributeError, OSError, SyntaxError) as exc:
        raise ConfigError(
            f"context extractor {spec!r} cannot be loaded ({exc}); give it as module:function "
            "with the module importable (in the current folder, on PYTHONPATH or installed), "
            "or as path/to/file.py:function"
        ) from None
    if not callable(fn):
        raise ConfigError(
            f"context extractor {spec!r} is not callable; name a function that takes the row "
            "(a dict) and returns its context items as a list of strings"
        )
    extractor: Extractor = fn
    return extractor


def _import(name: str) -> Any:
    """A module by name (the current folder is importable, as with `python -m`) or a .py file."""
    if name.endswith(".py") or "/" in name or os.sep in name:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise ImportError(f"no file {path}")
        mod_name = f"ctxprec_extractor_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(name)
