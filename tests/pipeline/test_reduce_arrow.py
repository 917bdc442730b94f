"""The output table's Arrow columns: Polars' 64-bit-offset strings narrowed to the schema's
`string` without pyarrow.compute (pipeline.reduce._fit)."""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pyarrow as pa
import pytest

from pipeline.reduce import _fit, _fit_any
from tests.fakes.inputs import REPO


@pytest.mark.parametrize(
    "values",
    [
        ["a", None, "", "ünïcödé ✓", "x" * 1000],
        [None, None],
        ["", "", ""],
        [],
    ],
)
def test_large_strings_are_narrowed_to_the_same_values(values: list[str | None]) -> None:
    wide = pl.Series(values, dtype=pl.String).to_arrow(compat_level=pl.CompatLevel.oldest())
    assert wide.type == pa.large_string()
    got = _fit(wide, pa.string())
    got.validate(full=True)
    assert got.type == pa.string()
    assert got.to_pylist() == values
    assert got.null_count == values.count(None)


def test_a_slice_keeps_its_offset_and_its_nulls() -> None:
    wide = pa.array(["zero", None, "two", "three", None, "five"], pa.large_string())
    part = wide.slice(1, 4)
    got = _fit(part, pa.string())
    got.validate(full=True)
    assert got.to_pylist() == [None, "two", "three", None]
    chunked = _fit_any(pa.chunked_array([wide.slice(0, 2), wide.slice(2)]), pa.string())
    assert chunked.type == pa.string() and chunked.to_pylist() == wide.to_pylist()


def test_other_types_are_cast_and_equal_types_returned_as_they_are() -> None:
    ints = pa.array([1, 2, None], pa.int64())
    assert _fit(ints, pa.int64()) is ints
    assert _fit(ints, pa.int32()).type == pa.int32()
    assert _fit(ints, pa.int32()).to_pylist() == [1, 2, None]


def test_building_the_output_table_does_not_import_pyarrow_compute() -> None:
    """pyarrow.compute costs ~25 ms to import; a plain score run never needs it."""
    probe = (
        "import sys, polars as pl, pyarrow as pa\n"
        "from pipeline.reduce import _arrow, _fit\n"
        "_arrow(['a', None, 'b'], pa.string())\n"
        "_fit(pl.Series(['x']).to_arrow(compat_level=pl.CompatLevel.oldest()), pa.string())\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False"]
