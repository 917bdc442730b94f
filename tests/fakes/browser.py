"""Debian's Chromium driven by Playwright, for the tests that look at pages as a person would
(never a browser download): skipped where either is missing, failed under CI=true."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def browser_or_skip() -> None:
    """Skip the test (fail it under CI=true) unless Playwright and Chromium are both here."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright (pip install -e '.[test]')")
    if not CHROMIUM.is_file():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if missing:
        reason = "browser tests need " + " and ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's sync API: its loop runs in the calling thread)."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()
