"""The table of figures (docs/performance.md) is written by bench/run_all.py from one run's
JSON results: only the marked block changes, writing the same results twice changes nothing,
and a smoke run never reaches that page. No benchmark runs here: the results are small
hand-made JSON files.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.fakes.inputs import REPO

BENCH = REPO / "bench"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    """(readme_table, run_all), imported the way the scripts import each other."""
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("readme_table", "run_all"):
        sys.modules.pop(name, None)
    return importlib.import_module("readme_table"), importlib.import_module("run_all")


RESULTS: dict[str, dict[str, Any]] = {
    "reduce_stage": {
        "verdicts": 10_000_000,
        "verdicts_per_s": 42.5e6,
        "speedup": 1.5,
        "loop_verdicts_per_s": 28.1e6,
        "stage_s": 0.235,
        "loop_with_conversion_s": 1.32,
        "identical_ap": True,
        "identical_score": True,
    },
    "warm_rerun": {
        "warm": {"items": 200_000, "items_per_s": 41_967.0, "run_items_per_s": 50_191.0},
        "cold": {"items_per_s": 13_234.0},
        "references": {
            "diskcache_keys_per_s": 98_000.0,
            "select_keys_per_s": 52_000.0,
            "judge_items_per_s": 16_000.0,
        },
    },
    "throughput": {
        "results": [
            {
                "concurrency": n,
                "calls": calls,
                "ideal_calls_per_s": ideal,
                "ratio": ratio,
                "ratio_steady": 0.98,
                "ctxprec": {"calls_per_s": c, "client_cpu_ms_per_call": 0.5},
                "bare": {"calls_per_s": b, "client_cpu_ms_per_call": 0.3},
            }
            for n, calls, ideal, ratio, c, b in [
                (64, 8000, 320, 0.966, 302, 312),
                (256, 25000, 1280, 0.942, 1159, 1231),
            ]
        ]
    },
    "memory": {
        "runs": [
            {"rows": 20_000, "maxrss_mib": 344.0, "rows_per_s": 4000.0},
            {"rows": 200_000, "maxrss_mib": 366.0, "rows_per_s": 4296.0},
        ],
        "ratio_largest_smallest": 1.06,
    },
    "rate_limit": {
        "rpm": 600,
        "runs": {
            "configured": {"rejected_429": 0, "accepted_per_min": 594.0, "span_s": 190.0},
            "adaptive": {"ratio_after_first": 1.0, "rejected_429": 113, "span_s": 190.0},
        },
    },
    "dask_scaling": {
        "latency_ms": 100,
        "scaling": [
            {"name": "local", "calls_per_s": 154.6},
            {"name": "dask x1", "calls_per_s": 154.2},
            {"name": "dask x2", "calls_per_s": 307.3},
            {"name": "dask x2, --rpm 1e6", "calls_per_s": 285.2},
        ],
        "rate": {
            "rpm": 3000.0,
            "limit_per_s": 50.0,
            "mean_per_s": 50.0,
            "max_per_s": 51,
            "busiest_10s": 501,
            "limit_10s": 500.0,
        },
    },
    "startup": {"python": 0.021, "version": 0.092, "help": 0.171},
    "dask_backfill": {
        "items": 1_000_000,
        "files": 8,
        "workers": 2,
        "distinct_pairs": 199_000,
        "requests": 199_000,
        "requests_per_distinct": 1.0,
        "judging_s": 120,
        "calls_per_s_per_worker": 829.2,
        "wall_s": 230.0,
        "client_peak_mib": 280.0,
        "worker_peak_mib": [300.0, 310.0],
    },
}

PAGE = """# A project

Intro with a table that is not ours:

| a | b |
|---|---|
| 1 | 2 |

## Performance

Words before.

<!-- bench-table:start: written by bench/run_all.py from its results; edit the script -->

| benchmark | figure | goal | result | command |
|---|---|---|---|---|
| old | old | old | old | old |

(old footer)

<!-- bench-table:end -->

Words after, and a line that looks like a row:
| benchmark | not | a | table | row |
"""


def saved_run(folder: Path, *, other_cores: float = 0.0, quick: bool = False) -> Path:
    """A results folder as a run of run_all.py leaves it (run_all.json and one JSON each)."""
    folder.mkdir(parents=True)
    ran = []
    for name, result in RESULTS.items():
        audit = {"busy_cores_at_start": 0.02, "other_cores_during": other_cores, "quick": quick}
        text = json.dumps({"benchmark": name, **audit, **result})
        (folder / f"{name}.json").write_text(text, encoding="utf-8")
        command = f"python bench/{name}.py" + (" --quick" if quick else "")
        ran.append({"name": name, "command": command, "exit_code": 0, "seconds": 10.0})
    meta = {"finished": "2026-11-30 21:40 UTC", "machine": "2 CPUs", "quick": quick, "ran": ran}
    (folder / "run_all.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def _outside(text: str) -> tuple[str, str]:
    start = text.index("<!-- bench-table:start")
    end = text.index("<!-- bench-table:end -->")
    return text[:start], text[end:]


def test_only_the_marked_block_changes(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _, run_all = bench
    readme = tmp_path / "README.md"
    readme.write_text(PAGE, encoding="utf-8")
    folder = saved_run(tmp_path / "run")
    assert run_all.main(["--from-results", str(folder), "--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert _outside(text) == _outside(PAGE)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`python" in line]
    assert len(rows) == 20  # 2 + 4 + 4 + 1 + 2 + 2 + 3 + 2: one row per figure
    # the goals as ratios to the same run's references: 41,967 ÷ 52,000, 13,234 ÷ 16,000
    assert "SELECT of the same keys (process wall) | ≥ 0.8x | ✅ 0.81x (41,967 items/s" in text
    assert "the offline judge alone on the same items (process wall) | ≥ 0.8x | ✅ 0.83x" in text
    assert "| old |" not in _inside(text)
    assert "(old footer)" not in text
    assert "| dask_scaling | judge calls/s, 2 workers ÷ 1 (100 ms judge) | – | 1.99x" in text
    assert "| dask_backfill | judge requests ÷ distinct pairs, 1,000,000 items in 8 files" in text
    assert "✅ 42.5 M |" in text
    assert "❌ 1.5x (loop 28.1 M/s" in text
    assert "(`python bench/run_all.py` finished 2026-11-30 21:40 UTC, 1.3 min:" in text
    assert "⚠" not in text


def _inside(text: str) -> str:
    before, after = _outside(text)
    return text[len(before) : len(text) - len(after)]


def test_writing_the_same_results_twice_changes_nothing(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    readme_table, run_all = bench
    readme = tmp_path / "README.md"
    readme.write_text(PAGE, encoding="utf-8")
    folder = saved_run(tmp_path / "run")
    ran, finished, machine = run_all.recorded(folder)
    block = readme_table.block(ran, folder, machine, finished)
    assert readme_table.write_block(readme, block) is True
    once = readme.read_bytes()
    assert readme_table.write_block(readme, block) is False
    assert run_all.main(["--from-results", str(folder), "--readme", str(readme)]) == 0
    assert readme.read_bytes() == once
    assert readme_table.replace_block(once.decode(), block) == once.decode()


def test_rows_measured_on_a_busy_machine_are_flagged(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    readme_table, run_all = bench
    folder = saved_run(tmp_path / "run", other_cores=0.8)
    ran, finished, machine = run_all.recorded(folder)
    block = readme_table.block(ran, folder, machine, finished)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "`python" in line]
    assert all("⚠ other processes used 0.80 cores meanwhile" in row for row in rows)
    assert "0.80 on average while one ran (⚠: rows so marked are suspect)" in block


def test_a_smoke_run_leaves_the_readme_alone(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, run_all = bench
    readme = tmp_path / "README.md"
    readme.write_text(PAGE, encoding="utf-8")
    monkeypatch.setattr(run_all, "README", readme)
    quick = saved_run(tmp_path / "quick", quick=True)
    assert run_all.main(["--from-results", str(quick)]) == 0
    assert readme.read_text(encoding="utf-8") == PAGE
    full = saved_run(tmp_path / "full")
    assert run_all.main(["--from-results", str(full), "--print"]) == 0
    assert readme.read_text(encoding="utf-8") == PAGE
    assert run_all.main(["--from-results", str(full)]) == 0
    assert readme.read_text(encoding="utf-8") != PAGE


@pytest.mark.parametrize(
    "page",
    [
        PAGE.replace("<!-- bench-table:end -->\n", ""),
        PAGE + "\n<!-- bench-table:start -->\n",
        PAGE.replace("<!-- bench-table:start", "<!-- table:start"),
    ],
    ids=["no end marker", "two start markers", "no start marker"],
)
def test_a_page_without_one_marked_block_is_refused(
    bench: tuple[ModuleType, ModuleType], page: str
) -> None:
    readme_table, _ = bench
    with pytest.raises(ValueError, match="bench-table"):
        readme_table.replace_block(page, "| new |")


def test_the_readme_holds_one_marked_table_in_the_written_format(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    """What run_all.py will replace: one marked block holding the header it writes."""
    readme_table, _ = bench
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    inside = _inside(text)
    assert inside.startswith(readme_table.START + "\n")
    assert "\n".join(readme_table.HEADER) in inside
    assert readme_table.replace_block(text, inside.split("\n", 1)[1]) == text
