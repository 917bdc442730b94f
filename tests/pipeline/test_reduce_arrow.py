"""The output table's Arrow columns: Polars' 64-bit-offset strings narrowed to the schema's
`string` without pyarrow.compute (ctxprec.flow.reduce._fit); and what a score run does not
import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from ctxprec.flow.reduce import _fit, _fit_any
from tests.fakes.inputs import REPO
from tests.pipeline.test_hot_path import write_fixed_input


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
    assert chunked.type == pa.string()
    assert chunked.to_pylist() == wide.to_pylist()


def test_other_types_are_cast_and_equal_types_returned_as_they_are() -> None:
    ints = pa.array([1, 2, None], pa.int64())
    assert _fit(ints, pa.int64()) is ints
    assert _fit(ints, pa.int32()).type == pa.int32()
    assert _fit(ints, pa.int32()).to_pylist() == [1, 2, None]


def test_a_score_run_imports_no_module_it_does_not_need(tmp_path: Path) -> None:
    """A whole score run (offline judge, memo on) imports neither pyarrow.compute (~25 ms:
    every kernel's wrapper is built at import), numpy.ma (~6 ms: Polars taking a NumPy array
    back checks for masked arrays) nor pandas (~0.35 s, through pyarrow.dataset or pa.array)."""
    data = write_fixed_input(tmp_path / "in.parquet", 30)
    argv = ["score", str(data), "-o", str(tmp_path / "out"), "--progress", "off", "--quiet"]
    argv += ["--cache-dir", str(tmp_path / "memo")]
    probe = (
        "import sys\n"
        "from ctxprec.cli.main import main\n"
        f"assert main({argv!r}) == 0\n"
        "print([m for m in ('pyarrow.compute', 'numpy.ma', 'pandas') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
