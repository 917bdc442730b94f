"""How the Python API takes names, decided once: every option key, keyword argument and data key
of the public API (the scorer's options, `run_evals`, `score_frame`, a data item, a target's
return) may be written in snake_case or in Mastra's camelCase (`contextExtractor`,
`onItemComplete`, `groundTruth`): the camelCase name is an alias of the snake_case one. Both
spellings of one name at once is an error naming the two, never a silent pick.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from ctxprec.storage.core.errors import ConfigError

__all__ = ["camel_case_keywords", "snake", "snake_keys"]

P = ParamSpec("P")
R = TypeVar("R")
_UPPER = re.compile(r"(?<=[a-z0-9])([A-Z])")


def snake(name: str) -> str:
    """`contextExtractor` -> `context_extractor`, `timeoutS` -> `timeout_s`; a snake_case
    name as it is."""
    return _UPPER.sub(r"_\1", name).lower() if name[:1].islower() else name


def snake_keys(given: Mapping[str, Any], what: str) -> dict[str, Any]:
    """`given` with every key in snake_case; a ConfigError naming both spellings when two keys
    are one name (`what` says where they were given: "options", "a data item")."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in given.items():
        name = snake(key) if isinstance(key, str) else key
        if name in out:
            raise ConfigError(
                f"{what}: {spelled[name]!r} and {key!r} are the same name ({name!r}); give one"
            )
        out[name], spelled[name] = value, key
    return out


def camel_case_keywords(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` taking each keyword argument in snake_case or camelCase. A camelCase name that is
    no parameter, or both spellings of one, is a TypeError naming what was given, as Python
    names an unexpected keyword argument."""
    params = inspect.signature(fn).parameters
    known = [p for p in params if params[p].kind is not inspect.Parameter.VAR_KEYWORD]

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        renamed: dict[str, Any] = {}
        for key, value in kwargs.items():
            name = snake(key)
            if name != key and name not in known:
                raise TypeError(
                    f"{fn.__name__}() got an unexpected keyword argument {key!r} (its "
                    f"keywords: {', '.join(known)}, or their camelCase spellings)"
                )
            if name in renamed:
                raise TypeError(
                    f"{fn.__name__}() got {name!r} twice (as {name!r} and its camelCase "
                    "spelling); give one"
                )
            renamed[name] = value
        return fn(*args, **renamed)  # type: ignore[arg-type]

    return call
