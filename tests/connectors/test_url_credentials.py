"""Credentials in a base URL. `user:password@` ended the run with aiohttp's
ValueError (exit 3) and was written to the manifest; `?api-key=...` was written to the
manifest and shown in debug logs. Now the first is refused before any call (exit 2, the
password not shown) and the second works with its value redacted everywhere ctxprec writes
or prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxprec.connectors.judges.secrets import redact
from ctxprec.storage.core.redact import without_url_secrets
from tests.fakes.inputs import REPO
from tests.fakes.judge_server import FakeJudgeServer
from tests.fakes.runs import score

SAMPLE = REPO / "examples" / "sample.parquet"
MODEL = ("--model", "openai/judge-1")


def with_userinfo(url: str) -> str:
    return url.replace("http://", "http://alice:hunter2pass@")


def test_user_and_password_in_base_url_are_refused_before_any_call(
    fake: FakeJudgeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = score(SAMPLE, "-o", tmp_path / "out", *MODEL, "--base-url", with_userinfo(fake.url))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "carries user:password@" in err
    assert "hunter2pass" not in err
    assert fake.stats.total == 0


def test_user_and_password_in_the_providers_variable_are_refused_too(
    fake: FakeJudgeServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", with_userinfo(fake.url))
    code = score(SAMPLE, "-o", tmp_path / "out", *MODEL)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "OPENAI_BASE_URL" in err
    assert "hunter2pass" not in err
    assert fake.stats.total == 0


def test_a_key_in_the_query_works_and_is_written_nowhere(
    fake: FakeJudgeServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXPREC_LOG_LEVEL", "debug")
    out = tmp_path / "out"
    url = f"{fake.url}?api-key=QSECRET0123456789"
    code = score(SAMPLE, "-o", out, *MODEL, "--base-url", url)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert fake.stats.total > 0
    assert "QSECRET" not in captured.out + captured.err
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in written)
    for path in written:
        assert b"QSECRET" not in path.read_bytes(), path


@pytest.mark.parametrize(
    ("text", "shown", "secret"),
    [
        ("https://u:pw9@host/v1", "https://***@host/v1", "pw9"),
        ("https://host/v1?api-key=abc7&x=1", "https://host/v1?api-key=***&x=1", "abc7"),
        ("'https://host/v1?x=1&token=t0k'", "'https://host/v1?x=1&token=***'", "t0k"),
        ("https://host/v1?sig=s5s&api_key=k", "https://host/v1?sig=***&api_key=***", "s5s"),
        ("https://host/v1?model=gpt-4o", "https://host/v1?model=gpt-4o", None),
    ],
)
def test_url_credentials_are_redacted(text: str, shown: str, secret: str | None) -> None:
    assert without_url_secrets(text) == shown
    if secret is not None:  # logs' redact may take more than the value, never less
        assert secret not in redact(text)
    else:
        assert redact(text) == text


@pytest.mark.parametrize("where", ["flag", "variable", "audit"])
def test_a_fragment_in_a_base_url_is_refused_before_any_call(
    where: str,
    fake: FakeJudgeServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fragment is never sent to a server: kept in a base URL it ended up inside the
    request's path (`…/v1#frag=…/chat/completions`) and in logs. It is refused, unshown."""
    url = f"{fake.url}#frag=FRAGSECRET42"
    args: list[object] = [SAMPLE, "-o", tmp_path / "out", *MODEL]
    if where == "flag":
        args += ["--base-url", url]
    elif where == "variable":
        monkeypatch.setenv("OPENAI_BASE_URL", url)
    else:
        args += ["--audit-model", "openai/judge-2", "--audit-base-url", url]
    code = score(*args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "fragment" in err
    assert "FRAGSECRET42" not in err
    assert fake.stats.total == 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


def test_a_bare_hash_is_a_fragment_too(
    fake: FakeJudgeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = score(SAMPLE, "-o", tmp_path / "out", *MODEL, "--base-url", f"{fake.url}#")
    assert code == 2
    assert "fragment" in capsys.readouterr().err
    assert fake.stats.total == 0


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("POST https://host/v1#frag=f9/chat/completions", "POST https://host/v1#***"),
        ("'https://host/v1?api-key=k1#tok=f9'", "'https://host/v1?api-key=***#***'"),
        ("row #3 of https://host/v1 failed", "row #3 of https://host/v1 failed"),
    ],
)
def test_url_fragments_are_redacted_in_what_is_written(text: str, shown: str) -> None:
    assert without_url_secrets(text) == shown
    assert "f9" not in redact(text)
