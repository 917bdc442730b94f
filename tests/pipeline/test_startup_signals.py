"""A stop while the command starts: a SIGINT 3-30 ms after start gave exit 1 with a
KeyboardInterrupt traceback from importlib (3 of 125 runs). The first lines of the console
script's module (`ctxprec.__main__`) hold SIGINT and SIGTERM, so a stop during the imports
that follow ends the command as a stop does later: the resume line and exit 130.

What remains is the interpreter's start-up before any line of ctxprec runs (and the package's
`__init__`, which imports nothing): a SIGINT before Python has set its own handler kills the
process by the signal (no traceback; the shell says 130), one after it raises KeyboardInterrupt
in `site` (an editable install's import finder is most of it) or the console script's first
imports. The test fails on a traceback from ctxprec's own code and prints how often each
outcome happened."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ctxprec.cli.process import INTERRUPTED
from tests.fakes.inputs import REPO, SAMPLE

RUNS = 100


def console_script() -> str:
    """The installed `ctxprec` console script next to this interpreter (what users run)."""
    found = Path(sys.executable).with_name("ctxprec")
    if found.exists():
        return str(found)
    on_path = shutil.which("ctxprec")
    if on_path is None:
        pytest.skip("no ctxprec console script installed")
    return on_path


# the package's files: this checkout's folders (an editable install) or an installed package
# (pipeline/ is ctxprec). Anchored, since the checkout itself may sit in a folder named ctxprec
# (.ci/run clones it so) and the interpreter's own files (site, an editable install's finder)
# then lie below a /ctxprec/ too
_ROOTS = rf"(?:{re.escape(str(REPO))}/(?:pipeline|connectors|storage)|[^\"]*/site-packages/ctxprec)"
_OURS = re.compile(rf'File "{_ROOTS}/[^"]*\.py"')
_INIT = re.compile(rf'File "{_ROOTS}/__init__\.py"')


def outcome(code: int, err: str) -> str:
    if "Traceback" in err or "KeyboardInterrupt" in err:
        ours = [f for f in _OURS.findall(err) if not _INIT.match(f)]
        return "traceback in ctxprec's code" if ours else "traceback in the interpreter's start-up"
    if code == 130 and INTERRUPTED in err:
        return "resume line, 130"
    if code == -signal.SIGINT and not err:
        return "killed by SIGINT before Python's handler (the shell's 130)"
    return f"exit {code}: {err.strip()[-200:]!r}"


@pytest.mark.slow
def test_no_start_up_stop_is_a_traceback(tmp_path: Path) -> None:
    """RUNS runs stopped 3-30 ms after start (the probe's window), then RUNS // 2 stopped
    30-150 ms after (on a loaded machine with an editable install, the interpreter alone
    takes ~40 ms: these land in ctxprec's imports)."""
    script, rng = console_script(), random.Random(20261207)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPREC_")}
    env["CTXPREC_CACHE_DIR"] = str(tmp_path / "memo")
    seen: dict[str, Counter[str]] = {"3-30 ms": Counter(), "30-150 ms": Counter()}
    delays = [("3-30 ms", rng.uniform(0.003, 0.030)) for _ in range(RUNS)]
    delays += [("30-150 ms", rng.uniform(0.030, 0.150)) for _ in range(RUNS // 2)]
    for run, (window, delay) in enumerate(delays):
        argv = [script, "score", str(SAMPLE), "-o", str(tmp_path / f"out{run}"), "--progress"]
        proc = subprocess.Popen(
            [*argv, "off"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(delay)  # when the signal lands: the point of the test
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        seen[window][outcome(proc.returncode, err)] += 1
    print({k: dict(v) for k, v in seen.items()})  # the report's figures: each window's outcomes
    allowed = {
        "resume line, 130",
        "killed by SIGINT before Python's handler (the shell's 130)",
        "traceback in the interpreter's start-up",
    }
    assert all(set(counts) <= allowed for counts in seen.values()), seen
    assert seen["30-150 ms"]["resume line, 130"]  # a stop in ctxprec's imports: as any stop


_PROBE = """
import json, signal, sys

found = []


class Watch:  # sees every module looked for, with the SIGINT handler in place at that moment
    def find_spec(self, name, path=None, target=None):
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            found.append(name)


sys.meta_path.insert(0, Watch())
import ctxprec.__main__

print(json.dumps(found))
"""


def test_nothing_is_imported_before_the_signals_are_held() -> None:
    """The window of ctxprec's own start-up, counted in modules rather than milliseconds:
    while Python's KeyboardInterrupt handler is in place, only the package and its __main__
    are looked for (the package's __init__ imports nothing); it was also typing, ctxprec.cli,
    ctxprec.cli.process and what that imports."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["ctxprec", "ctxprec.__main__"]
