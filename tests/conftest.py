"""Shared test fixtures: paths to the shared data, the sample, and an isolated memo folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
HOTPOT = SHARED / "datasets" / "hotpotqa_dev_distractor_500.parquet"
VECTORS = SHARED / "conformance" / "map_vectors.json"
SAMPLE = REPO / "examples" / "sample.parquet"


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test touches the user's real memo folder."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path_factory.mktemp("memo")))


@pytest.fixture
def hotpot() -> Path:
    if not HOTPOT.is_file():
        pytest.skip(f"shared dataset not found at {HOTPOT}")
    return HOTPOT
