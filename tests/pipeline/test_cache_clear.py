"""`ctxprec cache clear` removes paid verdicts only when asked to: it says what it would remove
(how many verdicts, their size, the tokens and money they took), asks on a terminal, and needs
--yes where there is none."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from ctxprec.cli.main import main
from ctxprec.storage.memo.store import Memo
from tests.fakes.inputs import REPO

GPT = "openai/gpt-4o-mini"  # 0.15 / 0.60 USD per million input / output tokens (the registry's)


def _paid_memo(folder: Path) -> Path:
    """Three verdicts of a paid judge: 3 M input and 300 k output tokens (0.45 + 0.18 USD)."""
    memo = Memo(folder)
    memo.set_many([(f"k{i}", (i % 2 == 0, "why", 1_000_000, 100_000)) for i in range(3)])
    memo.close()
    return folder


def _entries(folder: Path) -> int:
    memo = Memo(folder)
    try:
        return len(memo)
    finally:
        memo.close()


def test_without_a_terminal_it_says_what_it_would_remove_and_needs_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _paid_memo(tmp_path / "memo")
    assert main(["cache", "clear", "--cache-dir", str(folder), "--model", GPT]) == 2
    err = capsys.readouterr().err
    assert f"would remove 3 verdicts from {folder} (0.0 MiB)" in err
    assert "which took 3,000,000 input tokens and 300,000 output tokens" in err
    assert f"about $0.63 at {GPT}'s prices" in err
    assert "nothing removed: there is no terminal to ask on, so confirm with --yes" in err
    assert _entries(folder) == 3
    assert main(["cache", "clear", "--cache-dir", str(folder), "--yes"]) == 0
    assert f"removed 3 verdicts from {folder}; 0 left" in capsys.readouterr().out
    assert _entries(folder) == 0


def test_tokens_without_a_price_say_how_to_price_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CTXPREC_MODEL", raising=False)  # the default judge: offline, free
    folder = _paid_memo(tmp_path / "memo")
    assert main(["cache", "clear", "--cache-dir", str(folder)]) == 2
    assert "output tokens (--model PROVIDER/MODEL prices them)" in capsys.readouterr().err
    assert main(["cache", "clear", "--cache-dir", str(folder), "--older-than", "30d"]) == 0
    assert "holds no verdicts stored more than 30d ago; nothing to clear" in capsys.readouterr().out
    assert _entries(folder) == 3
    assert main(["cache", "info", "--yes", "--cache-dir", str(folder)]) == 2
    assert "--yes is for `ctxprec cache clear`" in capsys.readouterr().err


def _on_a_terminal(folder: Path, answer: bytes) -> str:
    """`ctxprec cache clear` with a pseudo-terminal for its stdin and stdout, answering the
    question with `answer` once it is asked; everything it printed."""
    main_fd, child_fd = pty.openpty()
    argv = [sys.executable, "-m", "ctxprec", "cache", "clear", "--cache-dir", str(folder)]
    proc = subprocess.Popen(
        [*argv, "--model", GPT], stdin=child_fd, stdout=child_fd, stderr=child_fd, cwd=REPO
    )
    os.close(child_fd)
    seen = b""
    answered = False
    try:
        while True:
            ready, _, _ = select.select([main_fd], [], [], 60)
            assert ready, f"no output from `ctxprec cache clear`: {seen!r}"
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # the child ended: the terminal is closed
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"[y/N] " in seen:
                os.write(main_fd, answer)
                answered = True
    finally:
        os.close(main_fd)
        assert proc.wait(timeout=60) == 0
    assert answered, seen
    return seen.decode().replace("\r\n", "\n")


def test_on_a_terminal_it_asks_and_removes_only_on_yes(tmp_path: Path) -> None:
    folder = _paid_memo(tmp_path / "memo")
    said = _on_a_terminal(folder, b"n\n")
    assert f"remove 3 verdicts from {folder} (0.0 MiB), which took 3,000,000 input" in said
    assert f"about $0.63 at {GPT}'s prices? [y/N] " in said
    assert "ctxprec memo: nothing removed" in said
    assert _entries(folder) == 3
    said = _on_a_terminal(folder, b"y\n")
    assert f"removed 3 verdicts from {folder}; 0 left" in said
    assert _entries(folder) == 0
