"""Every provider of the registry (connectors/judges/providers.toml) against the strict OpenAI
stand-in (tests/fakes/strict.py) served under that provider's own path root (/openai/v1,
/v1beta/openai, /api/v1, /inference/v1, none), with only that provider's key variable set: the
URL, the key header and the key. Then `ctxprec score --model PROVIDER/MODEL --base-url ...` on
labelled rows (rows equal the label MAP), a missing key (exit 2, no request, the variables
named), an unknown prefix (exit 2, the closest names), [providers.NAME] in a config, Azure
deployment URLs, the request shape whatever the prefix, prices, --batch-api and `ctxprec
providers`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.connectors.judges import ItemRequest, JudgeSettings, JudgeStats, create_judge
from ctxprec.connectors.judges.catalog import (
    ProviderSpec,
    builtin_providers,
    known_price,
    providers,
    registry_prices,
)
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.run.estimate import estimate, render_estimate
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.core.seams import Seams
from tests.fakes.batch_server import BatchFakeConfig, BatchFakeThread
from tests.fakes.inputs import KEY, documentation
from tests.fakes.judge_server import expected_verdict
from tests.fakes.strict import StrictConfig, StrictThread, running_strict

REGISTRY = builtin_providers()
OPENAI_KIND = sorted(p for p, s in REGISTRY.items() if s.kind == "openai-chat")
ALL_KEY_VARS = sorted({v for s in REGISTRY.values() for v in s.key_env} | {"AZURE_RESOURCE_NAME"})
ITEM = "Fact: the Eiffel tower is 330 metres tall."


def path_root(spec: ProviderSpec) -> str:
    """The provider's own path root, read off its registry URL ({VAR} hosts included)."""
    return urlsplit(spec.base_url.replace("{", "").replace("}", "")).path.rstrip("/")


def strict_config(spec: ProviderSpec, **kw: object) -> StrictConfig:
    header = "authorization" if spec.key_header.lower() == "authorization" else spec.key_header
    return StrictConfig(path_root=path_root(spec) or "/", key_header=header, **kw)  # type: ignore[arg-type]


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No provider key (nor base URL variable) in the environment."""
    for name in (*ALL_KEY_VARS, "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_registry_has_every_provider_the_issue_names() -> None:
    wanted = {"openai", "anthropic", "google", "groq", "mistral", "openrouter", "xai", "deepseek",
              "togetherai", "fireworks", "cerebras", "perplexity", "azure", "ollama", "lmstudio",
              "vllm"}  # fmt: skip
    assert wanted <= set(REGISTRY)
    assert REGISTRY["google"].key_env[0] == "GOOGLE_GENERATIVE_AI_API_KEY"
    assert {"GEMINI_API_KEY", "GOOGLE_API_KEY"} <= set(REGISTRY["google"].key_env)
    assert REGISTRY["togetherai"].key_env == ("TOGETHER_AI_API_KEY", "TOGETHER_API_KEY")
    assert REGISTRY["azure"].key_env == ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY")
    assert REGISTRY["azure"].key_header == "api-key"
    assert path_root(REGISTRY["google"]) == "/v1beta/openai"
    assert path_root(REGISTRY["openrouter"]) == "/api/v1"


@pytest.mark.parametrize("provider", OPENAI_KIND)
@pytest.mark.parametrize("which", ["first", "last"])
async def test_each_provider_under_its_own_path_root(
    provider: str, which: str, no_keys: pytest.MonkeyPatch
) -> None:
    """Only the provider's key variable set (its models.dev name, or the SDK's own): the key
    arrives in the provider's header at {its path root}/chat/completions."""
    spec = REGISTRY[provider]
    var = spec.key_env[0] if which == "first" else spec.key_env[-1]
    no_keys.setenv(var, KEY)
    async with running_strict(strict_config(spec, require_key=KEY)) as server:
        settings = JudgeSettings(model=f"{provider}/judge-model", base_url=server.url)
        judge = create_judge(settings, stats=JudgeStats())
        try:
            reply = await judge.judge_item(ItemRequest("How tall?", "330 m", ITEM))
        finally:
            await judge.aclose()
    assert reply.verdict.relevant == expected_verdict(ITEM)
    assert server.stats.paths == [f"{path_root(spec)}/chat/completions"]
    headers = {k.lower(): v for k, v in server.stats.headers[0].items()}
    if spec.key_header.lower() == "authorization":
        assert headers["authorization"] == f"Bearer {KEY}"
    else:
        assert headers[spec.key_header.lower()] == KEY
        assert "authorization" not in headers  # Azure: the key in api-key only
    assert server.stats.bodies[0]["model"] == "judge-model"
    assert judge.model == f"{provider}/judge-model"


@pytest.mark.parametrize("provider", ["ollama", "lmstudio", "vllm"])
async def test_local_servers_need_no_key_and_get_one_when_set(
    provider: str, no_keys: pytest.MonkeyPatch
) -> None:
    spec = REGISTRY[provider]
    async with running_strict(strict_config(spec)) as server:
        judge = create_judge(JudgeSettings(model=f"{provider}/m", base_url=server.url))
        await judge.judge_item(ItemRequest("q", None, ITEM))
        await judge.aclose()
    assert "authorization" not in {k.lower() for k in server.stats.headers[0]}
    assert create_judge(JudgeSettings(model=f"{provider}/m"))._url.startswith("http://127.0.0.1")  # type: ignore[attr-defined]


def test_a_price_read_from_its_line_alone_equals_the_whole_table_parsed() -> None:
    """known_price parses one line of the [prices] table (a run needs one model's price, and the
    table is 90 % of the file); every model's price must be what tomllib reads from the whole
    table, aliases included."""
    table = registry_prices()
    assert len(table) > 100
    for model, price in table.items():
        assert known_price(model) == price, model
    aliased = [
        (m, spec.aliases[0])
        for m in table
        for spec in [builtin_providers()[m.split("/")[0]]]
        if spec.aliases
    ]
    assert aliased  # e.g. gemini/... for google/...
    for model, alias in aliased:
        assert known_price(f"{alias}/{model.partition('/')[2]}") == table[model], model
    assert known_price("openai/no-such-model-anywhere") is None


def test_registry_urls_resolve_without_base_url(no_keys: pytest.MonkeyPatch) -> None:
    no_keys.setenv("GROQ_API_KEY", KEY)
    no_keys.setenv("AZURE_API_KEY", KEY)
    no_keys.setenv("GEMINI_API_KEY", KEY)
    urls = {
        m: create_judge(JudgeSettings(model=m))._url  # type: ignore[attr-defined]
        for m in ("groq/llama-3.3-70b-versatile", "google/gemini-2.5-flash")
    }
    assert urls["groq/llama-3.3-70b-versatile"] == "https://api.groq.com/openai/v1/chat/completions"
    assert urls["google/gemini-2.5-flash"] == (
        "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
    )
    with pytest.raises(ConfigError, match="AZURE_RESOURCE_NAME"):
        create_judge(JudgeSettings(model="azure/my-deployment"))
    no_keys.setenv("AZURE_RESOURCE_NAME", "myres")
    judge = create_judge(JudgeSettings(model="azure/my-deployment"))
    assert judge._url == "https://myres.openai.azure.com/openai/v1/chat/completions"  # type: ignore[attr-defined]


async def test_an_azure_deployment_url_keeps_its_api_version(no_keys: pytest.MonkeyPatch) -> None:
    no_keys.setenv("AZURE_OPENAI_API_KEY", KEY)
    config = StrictConfig(
        path_root="/openai/deployments/{deployment}", key_header="api-key", require_key=KEY
    )
    async with running_strict(config) as server:
        base = f"{server.root}/openai/deployments/gpt-4o-mini?api-version=2024-10-21"
        judge = create_judge(JudgeSettings(model="azure/gpt-4o-mini", base_url=base))
        await judge.judge_item(ItemRequest("q", "a", ITEM))
        await judge.aclose()
    assert server.stats.paths == ["/openai/deployments/gpt-4o-mini/chat/completions"]
    assert server.stats.queries == ["api-version=2024-10-21"]


@pytest.mark.parametrize(
    "model", ["openai/gpt-5-mini", "azure/gpt-5-mini", "openrouter/openai/gpt-5-mini"]
)
async def test_the_request_shape_follows_the_model_whatever_the_prefix(
    model: str, no_keys: pytest.MonkeyPatch
) -> None:
    spec = REGISTRY[model.split("/")[0]]
    no_keys.setenv(spec.key_env[0], KEY)
    async with running_strict(strict_config(spec, require_key=KEY)) as server:
        judge = create_judge(JudgeSettings(model=model, base_url=server.url))
        assert isinstance(judge, HttpJudgeBase)
        await judge.judge_item(ItemRequest("q", "a", ITEM))
        await judge.aclose()
    body = server.stats.bodies[0]
    assert "temperature" not in body
    assert body["reasoning_effort"] == "minimal"
    assert body["max_completion_tokens"] > StrictConfig().reasoning_cap
    assert body["model"] == model.split("/", 1)[1]
    assert server.stats.by_status == {200: 1}  # right the first time, no adaptation


# ---------------------------------------------------------------- the command line


def labelled_input(path: Path) -> Path:
    """Rows whose labels are the stand-in's verdicts: the judged MAP must equal the label MAP."""
    contexts = [[f"row {r} passage {i}" for i in range(4)] for r in range(6)]
    pq.write_table(
        pa.table(
            {
                "id": [f"r{r}" for r in range(6)],
                "query": [f"question {r}?" for r in range(6)],
                "expected_output": [f"answer {r}" for r in range(6)],
                "contexts": contexts,
                "labels": [[expected_verdict(t) for t in c] for c in contexts],
            }
        ),
        path,
    )
    return path


@pytest.mark.parametrize("provider", ["groq", "google", "azure", "openrouter", "mistral"])
def test_score_with_only_the_providers_key(
    provider: str, tmp_path: Path, no_keys: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = REGISTRY[provider]
    src = labelled_input(tmp_path / "in.parquet")
    with StrictThread(strict_config(spec, require_key=KEY)) as server:
        args = ["score", str(src), "-o", str(tmp_path / "out"), "--model", f"{provider}/m-1",
                "--base-url", server.url, "--map", "labels=labels",
                "--progress", "off"]  # fmt: skip
        assert main(args) == 2  # no key: nothing sent, the variable named
        err = capsys.readouterr().err
        assert server.stats.total == 0
        assert all(v in err for v in spec.key_env), err
        no_keys.setenv(spec.key_env[0], KEY)
        assert main(args) == 0, capsys.readouterr().err
        assert server.stats.total == 24
    rows = pl.read_parquet(tmp_path / "out" / "*.parquet")
    assert rows["score"].to_list() == rows["label_score"].to_list()
    assert set(rows["status"]) == {"ok"}
    assert set(rows["judge_model"]) == {f"{provider}/m-1"}


def test_an_unknown_provider_names_the_closest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = labelled_input(tmp_path / "in.parquet")
    assert main(["score", str(src), "-o", str(tmp_path / "o"), "--model", "gorq/x"]) == 2
    err = capsys.readouterr().err
    assert "unknown judge provider 'gorq'" in err
    assert re.search(r"closest known: groq", err), err
    assert "[providers.NAME]" in err  # how to add one
    assert not (tmp_path / "o").exists()


def test_a_config_adds_and_overrides_providers(
    tmp_path: Path, no_keys: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = labelled_input(tmp_path / "in.parquet")
    with StrictThread(StrictConfig(path_root="/llm/v2", require_key=KEY)) as server:
        config = tmp_path / "c.toml"
        config.write_text(
            f'[providers.mycorp]\nbase_url = "{server.root}/llm/v2"\nkey_env = ["MYCORP_KEY"]\n'
            f'[providers.groq]\nbase_url = "{server.root}/llm/v2"\n'
        )
        no_keys.setenv("MYCORP_KEY", KEY)
        no_keys.setenv("GROQ_API_KEY", KEY)
        for model in ("mycorp/m", "groq/m"):
            out = tmp_path / model.replace("/", "-")
            args = ["score", str(src), "-o", str(out), "--config", str(config), "--model", model,
                    "--progress", "off"]  # fmt: skip
            assert main(args) == 0, capsys.readouterr().err
        assert server.stats.paths[-1] == "/llm/v2/chat/completions"
        assert main(["providers", "--config", str(config)]) == 0
        listing = capsys.readouterr().out
        assert re.search(r"mycorp\s+MYCORP_KEY\s+set\s+http://127.0.0.1", listing), listing
    bad = tmp_path / "bad.toml"
    bad.write_text('[providers.x]\nkey_env = ["X"]\n')
    with pytest.raises(ConfigError, match=r"\[providers.x\] is a new provider: it needs base_url"):
        load_config(bad, {}, env={})
    bad.write_text('[providers.groq]\nkind = "soap"\n')
    with pytest.raises(ConfigError, match=r"kind .* must be one of openai-chat"):
        load_config(bad, {}, env={})


def test_providers_lists_every_provider_with_key_and_url(
    capsys: pytest.CaptureFixture[str], no_keys: pytest.MonkeyPatch
) -> None:
    no_keys.setenv("GROQ_API_KEY", KEY)
    assert main(["providers", "--json"]) == 0
    rows = {r["provider"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(REGISTRY)
    assert rows["groq"]["key"] == "set"
    assert rows["mistral"]["key"] == "not set"
    assert rows["azure"]["key_env"] == ["AZURE_API_KEY", "AZURE_OPENAI_API_KEY"]
    assert main(["providers"]) == 0
    text = capsys.readouterr().out
    for spec in REGISTRY.values():
        assert re.search(rf"^{re.escape(spec.id)}\s+{re.escape(spec.key_env[0])}", text, re.M)
        assert spec.base_url in text
    assert KEY not in text


def test_the_readme_judge_table_lists_every_provider() -> None:
    text = documentation()
    section = text[text.index("# Judges and providers") : text.index("How a judge works")]
    for spec in REGISTRY.values():
        assert f"| `{spec.id}/`" in section, spec.id
        assert spec.key_env[0] in section, spec.id


# ---------------------------------------------------------------- prices and batch APIs


def test_estimate_prices_registry_models_and_says_when_none_is_known(
    tmp_path: Path, no_keys: pytest.MonkeyPatch
) -> None:
    src = labelled_input(tmp_path / "in.parquet")
    assert known_price("groq/llama-3.3-70b-versatile") is not None
    assert known_price("together/meta-llama/Llama-3.3-70B-Instruct-Turbo") == known_price(
        "togetherai/meta-llama/Llama-3.3-70B-Instruct-Turbo"
    )
    cfg = load_config(None, {"judge.model": "groq/llama-3.3-70b-versatile"}, env={})
    est = estimate(str(src), cfg)
    price = known_price("groq/llama-3.3-70b-versatile")
    assert price is not None
    want = est["input_tokens"] * price.input_per_mtok + est["output_tokens"] * price.output_per_mtok
    assert est["cost_usd"] == round_figure(want / 1e6)  # the one rounding rule: 4 decimals
    assert "provider registry, prices of 2026-" in render_estimate(est)
    cfg = load_config(None, {"judge.model": "groq/no-such-model"}, env={})
    text = render_estimate(estimate(str(src), cfg))
    assert "no price known for groq/no-such-model" in text


class _RecordingEnviron(dict[str, str]):
    """The process environment, recording every write."""

    def __init__(self, base: dict[str, str]) -> None:
        super().__init__(base)
        self.written: list[str] = []

    def __setitem__(self, key: str, value: str) -> None:
        self.written.append(key)
        super().__setitem__(key, value)


def test_an_estimate_needs_no_key_and_never_writes_the_environment(
    tmp_path: Path, no_keys: pytest.MonkeyPatch
) -> None:
    """The estimate passes its judge a key source (a placeholder where no key is set): no
    fake key is written into the process environment, from whichever thread it runs."""
    src = labelled_input(tmp_path / "in.parquet")
    environ = _RecordingEnviron(dict(os.environ))
    no_keys.setattr(os, "environ", environ)
    cfg = load_config(None, {"judge.model": "openai/gpt-4o-mini"}, env={})
    est = estimate(str(src), cfg)
    assert est["calls"] > 0
    assert environ.written == []
    assert "OPENAI_API_KEY" not in environ


@pytest.mark.parametrize("provider", ["mistral", "google", "openrouter", "ollama"])
def test_batch_api_is_refused_where_the_provider_has_none(
    provider: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_keys: pytest.MonkeyPatch
) -> None:
    src = labelled_input(tmp_path / "in.parquet")
    no_keys.setenv(REGISTRY[provider].key_env[0], KEY)
    with StrictThread(strict_config(REGISTRY[provider])) as server:
        args = ["score", str(src), "-o", str(tmp_path / "o"), "--model", f"{provider}/m",
                "--base-url", server.url, "--batch-api", "--batch-wait", "0"]  # fmt: skip
        assert main(args) == 2
        assert server.stats.total == 0
    err = capsys.readouterr().err
    assert "has none that ctxprec speaks" in err
    assert "azure, groq" in err


def test_batch_providers_of_the_registry() -> None:
    batch = {p: s.batch for p, s in providers().items() if s.batch}
    assert batch == {"openai": "openai", "azure": "openai", "groq": "openai",
                     "anthropic": "anthropic"}  # fmt: skip
    assert REGISTRY["azure"].batch_endpoint == "/chat/completions"
    assert REGISTRY["groq"].batch_endpoint == "/v1/chat/completions"


@pytest.mark.parametrize("provider", ["groq", "azure"])
def test_batch_api_through_groq_and_azure(
    provider: str,
    tmp_path: Path,
    no_keys: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """OpenAI's Files + Batches under the provider's own root, with its key header and its
    batch endpoint (Azure: /chat/completions): every row from the batch, no online call."""
    spec = REGISTRY[provider]
    no_keys.setenv("CTXPREC_BATCH_POLL_S", "0.02")
    no_keys.setenv("CTXPREC_BATCH_POLL_MAX_S", "0.05")
    no_keys.setenv(spec.key_env[-1], KEY)
    header = "api-key" if provider == "azure" else "authorization"
    config = BatchFakeConfig(openai_root=path_root(spec), key_header=header, require_key=KEY)
    src = labelled_input(tmp_path / "in.parquet")
    with BatchFakeThread(config) as server:
        args = ["score", str(src), "-o", str(tmp_path / "out"), "--model", f"{provider}/m",
                "--base-url", server.url, "--batch-api", "--map", "labels=labels",
                "--progress", "off"]  # fmt: skip
        assert main(args) == 0, capsys.readouterr().err
        assert server.online_calls == 0
        assert server.stats.batches_created == 1
        assert server.stats.rejected == {}
    rows = pl.read_parquet(tmp_path / "out" / "*.parquet")  # labels: the server's verdicts
    assert rows["verdicts"].to_list() == rows["label_verdicts"].to_list()
    assert rows["score"].to_list() == rows["label_score"].to_list()
    assert set(rows["status"]) == {"ok"}


def readme_provider_lines() -> list[str]:
    """The README's registry examples (the Judges block that starts with `ctxprec providers`)."""
    text = documentation()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    block = next(b for b in blocks if "ctxprec providers" in b)
    return [line for line in block.splitlines() if line and not line.startswith(("#", "export"))]


@pytest.mark.parametrize("prefix", ["groq/", "google/", "azure/", "ollama/"])
def test_readme_registry_examples_run_as_written(
    prefix: str, tmp_path: Path, no_keys: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each line with its own environment, against a strict stand-in under the provider's root
    (the only change: --base-url at the stand-in, and local input and output paths)."""
    line = next(x for x in readme_provider_lines() if f"--model {prefix}" in x)
    words = line.split()
    at = words.index("ctxprec")
    for assignment in words[:at]:
        name, _, value = assignment.partition("=")
        no_keys.setenv(name, KEY if name.endswith("_KEY") else value)
    spec = REGISTRY[prefix.rstrip("/")]
    required = KEY if spec.key_required != "never" else None
    args = words[at + 1 :]
    args[args.index("logs.parquet")] = str(labelled_input(tmp_path / "logs.parquet"))
    args[args.index("-o") + 1] = str(tmp_path / "out")
    with StrictThread(strict_config(spec, require_key=required)) as server:
        assert main([*args, "--base-url", server.url, "--progress", "off"]) == 0
        assert server.stats.total == 24
    assert main(["providers"]) == 0
    assert "ctxprec judge providers" in capsys.readouterr().out


def test_a_key_source_passed_in_is_read_instead_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that needs no real key (an estimate makes no call) passes where keys are read;
    the process environment is neither read for the key nor written."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings = JudgeSettings(model="openai/gpt-4o-mini")
    before = dict(os.environ)
    judge = create_judge(settings, seams=Seams(keys={"OPENAI_API_KEY": "sk-from-source"}.get))
    assert isinstance(judge, HttpJudgeBase)
    assert judge.auth_headers()["Authorization"] == "Bearer sk-from-source"
    assert dict(os.environ) == before
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with pytest.raises(ConfigError, match="needs an API key: set the environment variable OPENAI"):
        create_judge(settings, seams=Seams(keys={}.get))  # the source replaces the environment


@pytest.mark.parametrize(
    ("model", "suggested"),
    [
        ("gpt-4o-mini", "did you mean openai/gpt-4o-mini?"),
        ("gemini-2.0-flash", "did you mean google/gemini-2.0-flash?"),
        ("gpt4omini", "did you mean openai/gpt-4o-mini?"),  # a typo: the nearest listed model
    ],
)
def test_a_model_without_its_provider_is_offered_the_provider_that_serves_it(
    model: str, suggested: str
) -> None:
    """`--model gpt-4o-mini` said "the closest known: gemini"; the registry knows who serves it."""
    with pytest.raises(ConfigError, match=re.escape(suggested)):
        create_judge(JudgeSettings(model=model))
