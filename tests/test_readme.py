"""The README runs as written. Its Python example prints what it says, and every `ctxprec`
command in the ```bash blocks of README.md and of docs/*.md (and the Airflow recipe's
bash_command) runs in a temp folder against the loopback fake judge and exits as the page says.

Only paths, ports and keys are substituted: absolute paths move under the temp folder, a
`--base-url http://127.0.0.1:PORT/v1` points at the fake server, keys and base URLs come from
the environment. Input paths a command names are created with sample rows when missing. A line
ending in `# readme-test: skip (why)` is not run; keep that for commands that need what a test
cannot have here (a running cluster on other hosts). A line ending in `# readme-test: exit N`
must exit N (a quality gate that is meant to fail); every other command must exit 0.
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.fakes.inputs import KEY, REPO, documentation
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread

README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = sorted((REPO / "docs").glob("*.md"))  # pages moved out of the README, tested the same way
SKIP_MARK = "# readme-test: skip"
EXIT_MARK = re.compile(r"# readme-test: exit (\d+)")
OBJECT_STORE = re.compile(r"\b(s3|gs|az|abfs)://")
DS = "2026-11-30"


PYTHON_API = REPO / "docs" / "python-api.md"
SAID = re.compile(r"^\s*print\(.*\)  # (.+)$", re.M)  # `print(...)  # what it prints`


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("block", range(len(_python_blocks(PYTHON_API))))
def test_python_api_examples_run_as_written(block: int, tmp_path: Path) -> None:
    """Every example of the Python API page runs as written in a fresh folder (its memo and
    output there), and prints what its `print(...)  # VALUE` comments say, in order."""
    example = _python_blocks(PYTHON_API)[block]
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    said = SAID.findall(example)
    assert said == [line for line in printed if line in said]
    if "create_context_precision_scorer(\n    model=" in example:  # the page's first example
        assert printed[0] == "0.83"


def test_readme_reader_of_exactly_ctxprecs_parts(tmp_path: Path) -> None:
    """The README's first command, the user's own Parquet files dropped into its output, then
    the README's `part_files` reader: it prints the 12 scored rows only."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    text = documentation()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "part_files" in b)
    command = re.search(r"\.venv/bin/ctxprec (score examples/sample\.parquet -o out/sample)", text)
    assert command is not None
    args = command.group(1).replace("examples/", f"{REPO}/examples/").split()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "ctxprec.cli.main", *args, "--progress", "off"]
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for rel in ("mine.parquet", ".backup/old.parquet", "dt=x/y.parquet"):
        (tmp_path / "out" / "sample" / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"other": [1, 2]}), tmp_path / "out" / "sample" / rel)
    done = subprocess.run(
        [sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["12"]


# -- extracting the commands ----------------------------------------------------------------
def _logical_lines(block: str) -> Iterator[str]:
    """Lines of a bash block with backslash continuations joined."""
    pending = ""
    for raw in block.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield (pending + raw).strip()
        pending = ""


def _ctxprec_segments(line: str) -> list[str]:
    """The `ctxprec ...` commands of one shell line (`a && b`, a `# comment` at the end)."""
    code = line.split(" #", 1)[0] if not line.startswith("#") else ""
    out = []
    segments = re.split(r"&&|;|\|\|", code)
    for segment in segments:
        words = segment.strip().split(maxsplit=1)
        if words and Path(words[0]).name == "ctxprec":
            out.append("ctxprec " + (words[1] if len(words) > 1 else ""))
    if len(out) > 1 and len(out) == len(segments) == code.count("&&") + 1:
        return [" && ".join(out)]  # `ctxprec a && ctxprec b`: one chain, run as written
    return out


# Pages, or `## ` sections of a page, whose commands need a server of their own or a script's
# variables; each has a test that runs every ctxprec command there as written.
JUDGES = "tests/test_readme_judges.py (strict provider stand-ins, a real llama.cpp server)"
VIEW = "tests/pipeline/test_view.py (started on a free port, queried, stopped by Ctrl-C)"
RUN_ELSEWHERE = {
    ("docs/judges.md", ""): f"{JUDGES} and tests/connectors/test_registry_providers.py",
    ("docs/nightly.md", "## Nightly quality gate"): "tests/test_readme_gate.py (the script)",
    ("docs/comparing.md", ""): "tests/test_readme_gate.py (the A/B and judge commands)",
    ("docs/batch-api.md", ""): "tests/pipeline/test_batch_api.py (the loopback batch APIs)",
}


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each `## ` section (the part before the first one has heading '')."""
    parts = re.split(r"(?m)^(## .*)$", text)
    out = [("", parts[0])]
    out += [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return out


def elsewhere(page: str, heading: str, command: str) -> str | None:
    """Which test runs this command instead of this file, if another one does."""
    if command.startswith("ctxprec view"):  # a server: it runs until Ctrl-C
        return VIEW
    if OBJECT_STORE.search(command):
        return "tests/connectors/test_object_store.py (the loopback S3 server)"
    found = (why for (p, h), why in RUN_ELSEWHERE.items() if p == page and heading.startswith(h))
    return next(found, None)


def readme_commands(text: str = README, page: str = "README.md") -> list[tuple[str, int]]:
    """Every ctxprec command of the bash blocks and of the Airflow bash_command, with the exit
    code it must give: 0, or N when its line ends in `# readme-test: exit N` (a failing gate).
    Commands another test runs come with exit code -1 (the test says which and skips them)."""
    commands: list[tuple[str, int]] = []
    for heading, body in _sections(text):
        for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
            for line in _logical_lines(block):
                if SKIP_MARK not in line:
                    code = EXIT_MARK.search(line)
                    want = int(code.group(1)) if code else 0
                    for c in _ctxprec_segments(line):
                        commands.append((c, -1 if elsewhere(page, heading, c) else want))
        for block in re.findall(r"```python\n(.*?)```", body, flags=re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.keyword) and node.arg == "bash_command":
                    value = str(ast.literal_eval(node.value)).replace("{{ ds }}", DS)
                    for c in _ctxprec_segments(value):
                        commands.append((c, -1 if elsewhere(page, heading, c) else 0))
    return commands


def documented_commands() -> list[tuple[str, str, int]]:
    """(page, command, exit code) of README.md and of every page under docs/."""
    pages = [("README.md", README)]
    pages += [(f"docs/{p.name}", p.read_text(encoding="utf-8")) for p in DOCS]
    return [(page, c, code) for page, text in pages for c, code in readme_commands(text, page)]


def test_commands_are_found(tmp_path: Path) -> None:
    found = [c for _, c, _ in documented_commands()]
    assert any(c.startswith("ctxprec score examples/sample.parquet") for c in found)
    assert any("--incremental" in c and "--sink delta:" in c for c in found)  # nightly + Airflow
    assert any("--sink iceberg:" in c for c in found)  # the nightly recipe's Iceberg table
    assert "PYICEBERG_CATALOG__LAKE__URI" in _exported(tmp_path)  # and its catalog
    assert sum("dt=" in c for c in found) >= 2
    in_docs = [c for page, c, _ in documented_commands() if page.startswith("docs/")]
    assert any("--engine dask" in c for c in in_docs)  # docs/dask.md's local cluster
    pages = {page for page, _, _ in documented_commands()}
    for page, _ in RUN_ELSEWHERE:
        assert page in pages, f"RUN_ELSEWHERE names {page}, which has no command"


def test_readme_links_to_pages_that_exist() -> None:
    """The README's short sections point to docs/ and bench/ pages: each link resolves."""
    links = re.findall(r"\]\(((?:docs|bench)/[^)#]+)", README)
    pages = {"docs/dask.md", "docs/performance.md", "docs/judges.md", "docs/nightly.md"}
    assert pages <= set(links)
    for link in links:
        assert (REPO / link).is_file(), link


# -- running them ---------------------------------------------------------------------------
def _localize(command: str, root: Path, fake_url: str) -> str:
    """Absolute paths under `root`; a loopback --base-url at the fake server."""
    command = re.sub(r"http://127\.0\.0\.1:\d+/v1", fake_url, command)
    return re.sub(r"(?<=[\s=:\"'])/(?=[A-Za-z])(?!dev/)", str(root) + "/", command)


def _log_rows() -> pl.DataFrame:
    sample = pl.read_parquet(REPO / "examples" / "sample.parquet")
    # nightly.sh pairs nights on query_id: the same query asked every night
    return sample.with_columns(pl.lit(DS).alias("dt"), pl.col("id").alias("query_id"))


def _inputs(command: str, root: Path) -> None:
    """Create the input a `score`/`estimate` command names when the temp folder lacks it."""
    words = shlex.split(command.replace("$(date +%F)", dt.date.today().isoformat()))
    for flag, value in itertools.pairwise(words):
        bundled, wanted = REPO / "configs" / Path(value).name, root / value
        if flag == "--config" and not wanted.exists() and bundled.is_file():
            wanted.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(bundled, wanted)  # a deployment's copy of a bundled config
    if len(words) < 3 or words[1] not in ("score", "estimate"):
        return
    target = root / words[2]
    if target.exists() or any(ch in words[2] for ch in "*?["):
        return
    if target.suffix == ".parquet":
        target.parent.mkdir(parents=True, exist_ok=True)
        _log_rows().write_parquet(target)
    elif not target.suffix:
        target.mkdir(parents=True, exist_ok=True)
        rows = _log_rows()  # a dt=... folder carries dt itself, as a Hive layout does
        rows = rows.drop("dt") if "dt=" in target.as_posix() else rows
        rows.write_parquet(target / "part-0.parquet")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeJudgeServer]:
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        yield server


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh folder per command, holding the bundled examples and configs."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


EXPORT = re.compile(r"^export (PYICEBERG_[A-Z0-9_]+)=(\S+)$", re.M)


def _exported(root: Path) -> dict[str, str]:
    """The README's `export PYICEBERG_...` lines (the nightly recipe's Iceberg catalog) with
    absolute paths moved under `root`; a SQLite catalog's folder is made (the recipe's mkdir)."""
    env = {}
    for name, value in EXPORT.findall(documentation()):
        value = re.sub(r"(sqlite:///|file://)/(?=[A-Za-z])", lambda m: f"{m[1]}{root}/", value)
        if value.startswith("sqlite:///"):
            Path(value.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        env[name] = value
    return env


def _env(root: Path, fake_url: str) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPREC_", "OPENAI_"))}
    env.pop("ANTHROPIC_API_KEY", None)
    env |= _exported(root)  # the nightly recipe's Iceberg catalog
    return env | {
        "PATH": bindir + os.pathsep + env.get("PATH", ""),
        "OPENAI_API_KEY": KEY,
        "ANTHROPIC_API_KEY": KEY,
        "OPENAI_BASE_URL": fake_url,
        "ANTHROPIC_BASE_URL": fake_url,
        "CTXPREC_BASE_URL": fake_url,  # over a config's own base_url (vLLM on port 8000)
        "CTXPREC_CACHE_DIR": str(root / "memo"),
        # nothing leaves loopback: an object-store URL that slips through meets a closed port
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.mark.parametrize(("page", "command", "exit_code"), documented_commands())
def test_readme_command_runs(
    page: str,
    command: str,
    exit_code: int,
    workdir: Path,
    fake: FakeJudgeServer,
    request: pytest.FixtureRequest,
) -> None:
    if exit_code == -1:
        pytest.skip("run as written by another test: see RUN_ELSEWHERE")
    local = _localize(command, workdir, fake.url)
    _inputs(local.split(" && ")[0], workdir)  # a chain's later steps read what earlier ones wrote
    done = subprocess.run(
        ["bash", "-c", local],
        cwd=workdir,
        env=_env(workdir, fake.url),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == exit_code, f"{page}: {local}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr


def _nightly_scores() -> list[tuple[str, str]]:
    """(page, command) of every documented nightly scoring run: each `ctxprec score ...
    --incremental` of README.md and docs/*.md (the recipes, the Airflow bash_command, nightly.sh
    with its dates filled in), an object store's excepted."""
    found = []
    for page, command, _ in documented_commands():
        first = command.split(" && ")[0]
        nightly = first.startswith("ctxprec score") and "--incremental" in first
        if nightly and not OBJECT_STORE.search(first):
            found.append((page, first.replace("$NIGHT", DS).replace("$LAST", DS)))
    return found


def _failing_gate(command: str) -> str:
    """The command with a gate the sample's rows fail: `--fail-under 0.99` in place of (or
    after) its own."""
    if "--fail-under" in command:
        return re.sub(r"--fail-under [\d.]+", "--fail-under 0.99", command)
    return command + " --fail-under 0.99"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command"), _nightly_scores())
def test_nightly_recipe_holds_its_gate_on_a_retry(
    page: str, command: str, workdir: Path, fake: FakeJudgeServer
) -> None:
    """A retried night: the documented nightly command with a gate its rows fail, run twice in
    the same folder as Airflow's `retries` or a cron wrapper would (the second finds nothing
    new to score): exit 5 both times, and the --quiet JSON line carries the gate each time."""
    local = _localize(_failing_gate(command), workdir, fake.url)
    _inputs(local, workdir)
    env = _env(workdir, fake.url)
    shown = []
    for attempt in (1, 2):
        done = subprocess.run(
            ["bash", "-c", local], cwd=workdir, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 5, f"{page} attempt {attempt}: {local}\n{done.stderr}"
        assert "gate failed (exit 5)" in done.stderr
        if "--quiet" in local:
            line = json.loads(done.stdout.strip().splitlines()[-1])
            assert line["exit_code"] == 5
            assert line["quality_gate"]["outcome"] == "failed"
            shown.append((line["quality_gate"]["mean"], line["quality_gate"]["rows"]))
    assert len(set(shown)) <= 1  # the same figure on the retry


def test_nightly_recipes_are_found() -> None:
    pages = {page for page, _ in _nightly_scores()}
    assert "docs/nightly.md" in pages
    commands = [c for _, c in _nightly_scores()]
    assert any("--sink delta:" in c for c in commands)  # the warehouse recipe
    assert any("--fail-under" in c for c in commands)  # the gated ones, nightly.sh among them
    assert any("query_id" in c for c in commands)  # nightly.sh's score line


def test_first_command_prints_what_the_readme_shows(fake: FakeJudgeServer, tmp_path: Path) -> None:
    """The README shows the first run's lines and a second run's on a machine with a memo."""
    env = _env(tmp_path, fake.url)
    shown = re.search(r"It prints something like:\n\n```\n(.*?)```", README, re.S)
    again = re.search(r"already has a memo.*?\n\n```\n(.*?)```", README, re.S)
    assert shown, "README: the first command's output blocks are missing"
    assert again, "README: the first command's output blocks are missing"
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    for block, out in ((shown, "out/sample"), (again, "out/sample2")):
        args = ["ctxprec", "score", "examples/sample.parquet", "-o", out]
        done = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        got, want = done.stdout.splitlines(), block.group(1).splitlines()
        assert got[0] == want[0].replace("out/sample", out)
        assert _memo_hits(got) == _memo_hits(want)


def _memo_hits(lines: list[str]) -> str:
    line = next(x for x in lines if "this run:" in x)
    return re.sub(r", [\d.]+ (s|min)\b.*", "", line)


def test_extraction_follows_the_markers() -> None:
    text = (
        "```bash\n"
        "# a comment line\n"
        "python3 -m venv .venv && .venv/bin/ctxprec score a.parquet -o out/a\n"
        "ctxprec score b.parquet -o out/b \\\n"
        "    --quiet  # readme-test: skip (elsewhere)\n"
        "ctxprec compare out/a out/b --fail-under 0.9  # readme-test: exit 5\n"
        "ctxprec score c.parquet -o out/c && ctxprec summary out/c\n"
        "```\n"
    )
    assert readme_commands(text) == [
        ("ctxprec score a.parquet -o out/a", 0),
        ("ctxprec compare out/a out/b --fail-under 0.9", 5),
        ("ctxprec score c.parquet -o out/c && ctxprec summary out/c", 0),
    ]


def test_the_tests_that_run_other_sections_exist() -> None:
    for why in [*RUN_ELSEWHERE.values(), VIEW]:
        assert (REPO / why.split()[0]).is_file(), why
