"""The query parameters `ctxprec view` accepts, parsed and bounded: every name known, every number
an integer in range, every status, band, sort and group one of the output's own; anything else
is a `BadRequest` (400 with a JSON error saying what is allowed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ctxprec.storage.report.pairs import PAIR_SORTS, PairFilter
from ctxprec.storage.report.table import BAND_NAMES, SORTS, STATUSES, RowFilter, RowTable

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "BadRequest",
    "page_params",
    "pair_filter",
    "row_filter",
    "side",
]

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_PAGE = 10_000_000  # 2 billion rows at the largest page size
MAX_SEARCH = 200  # characters
MAX_VALUE = 500  # characters of a group value or an id
ROW_PARAMS = frozenset({"side", "q", "status", "band", "group_by", "group", "sort", "page", "size"})
PAIR_PARAMS = frozenset({"q", "status", "changed", "sort", "page", "size"})


class BadRequest(ValueError):
    """A query the server refuses; the message says what is allowed."""


def known(query: Mapping[str, str], allowed: frozenset[str]) -> None:
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise BadRequest(
            f"unknown parameter {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _text(query: Mapping[str, str], name: str, limit: int) -> str:
    value = query.get(name, "")
    if len(value) > limit:
        raise BadRequest(f"{name} is {len(value):,} characters long; at most {limit}")
    return value


def _choice(query: Mapping[str, str], name: str, allowed: Sequence[str]) -> str:
    value = query.get(name, "")
    if value not in allowed:
        shown = ", ".join(a or '"" (none)' for a in allowed)
        raise BadRequest(f"{name}={value!r} is not one of: {shown}")
    return value


def _int(query: Mapping[str, str], name: str, default: int, top: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
        raise BadRequest(f"{name}={raw[:40]!r} is not a whole number from 1 to {top:,}")
    value = int(raw)
    if not 1 <= value <= top:
        raise BadRequest(f"{name}={value} is out of range: 1 to {top:,}")
    return value


def page_params(query: Mapping[str, str]) -> tuple[int, int]:
    """(page, size): 1-based page, size up to MAX_PAGE_SIZE."""
    return _int(query, "page", 1, MAX_PAGE), _int(query, "size", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def side(query: Mapping[str, str], tables: Sequence[RowTable]) -> RowTable:
    """`side=a` (the default) or `side=b` (with two outputs)."""
    names = ("a", "b")[: len(tables)]
    got = query.get("side", "a")
    if got not in names:
        raise BadRequest(f"side={got[:40]!r} is not one of: {', '.join(names)}")
    return tables[names.index(got)]


def row_filter(query: Mapping[str, str], table: RowTable) -> tuple[RowFilter, str]:
    """The filter and the sort of a `/api/rows` query on `table`."""
    known(query, ROW_PARAMS)
    group_by = query.get("group_by", "")
    if group_by and group_by not in table.group_columns:
        groups = ", ".join(table.group_columns) or "none in this output"
        raise BadRequest(f"group_by={group_by[:60]!r} is not a grouping column ({groups})")
    group = query.get("group")
    if group is not None and not group_by:
        raise BadRequest("group needs group_by (the column the value belongs to)")
    if group is not None and len(group) > MAX_VALUE:
        raise BadRequest(f"group is {len(group):,} characters long; at most {MAX_VALUE}")
    found = RowFilter(
        search=_text(query, "q", MAX_SEARCH),
        status=_choice(query, "status", ("", *STATUSES)) or None,
        band=_choice(query, "band", ("", *BAND_NAMES)) or None,
        group_by=group_by or None,
        group=group,
    )
    return found, _choice(query, "sort", SORTS)


def pair_filter(query: Mapping[str, str]) -> tuple[PairFilter, str]:
    """The filter and the sort of a `/api/compare` query."""
    known(query, PAIR_PARAMS)
    found = PairFilter(
        search=_text(query, "q", MAX_SEARCH),
        status=_choice(query, "status", ("", *STATUSES)) or None,
        changed=_choice(query, "changed", ("", "0", "1")) == "1",
    )
    return found, _choice(query, "sort", PAIR_SORTS)
