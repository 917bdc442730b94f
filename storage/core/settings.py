"""Every setting of ctxprec and its default, in one place: one frozen dataclass per TOML section
([judge] [limits] [columns] [scoring] [run] [output] [gate] [storage] [mlflow] [otel], and
[prices] as a table of `Price`). A field's default here is THE default, for the CLI, the TOML
file and the Python API alike; its metadata names the environment variable and the CLI flag that
set it (if any), the values it allows and a one-line help. `pipeline/config.py` loads them
(defaults < TOML < environment < flags); `pipeline/cli/main.py` builds its flags and `--help`
defaults from them.

A leaf module: layers above import the section they need (judges [judge], sources [columns],
ctxprec.storage.files.fs [storage]) and nothing here imports them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_EXPECTED",
    "DEFAULT_KS",
    "DUPLICATE_POLICIES",
    "SECTIONS",
    "ColumnMap",
    "ColumnsSettings",
    "GateSettings",
    "JudgeSettings",
    "LimitsSettings",
    "MlflowSettings",
    "OtelSettings",
    "OutputSettings",
    "Price",
    "RunSettings",
    "ScoringSettings",
    "SettingSpec",
    "StorageSettings",
    "named",
    "named_as_options",
    "settings",
]

Rule = tuple[Callable[[Any], bool], str]  # (is the value allowed, "what it must be" for errors)


def setting(
    default: Any,
    help: str,
    *,
    env: str | None = None,
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    rule: Rule | None = None,
    unset: str = "",
    metavar: str | None = None,
) -> Any:
    """A section field: its default and what the loader and the CLI need to know about it.
    `unset` says what a default of None (or an empty list) means in `--help`."""
    meta = {
        "help": help,
        "env": env,
        "flag": flag,
        "choices": choices,
        "rule": rule,
        "unset": unset,
        "metavar": metavar,
    }
    return dataclasses.field(default=default, metadata=meta)


def _positive(v: Any) -> bool:
    return v is None or v > 0


def _entries_ok(entries: Any) -> bool:
    """`--passthrough` entries: COL or COL=NEW_NAME, neither side empty."""
    for entry in entries:
        source, sep, target = str(entry).partition("=")
        if sep and (not source.strip() or not target.strip()):
            return False
    return True


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True, slots=True)
class JudgeSettings:
    """[judge]: which model judges and how it is called. Never a secret: only the env var's
    name (`api_key_env`)."""

    model: str = setting(
        "offline", "provider/model, e.g. openai/gpt-4o-mini", env="CTXPREC_MODEL", flag="--model"
    )
    base_url: str | None = setting(
        None,
        "OpenAI-compatible or Anthropic base URL",
        env="CTXPREC_BASE_URL",
        flag="--base-url",
        unset="the provider's (`ctxprec providers`; OPENAI_BASE_URL / ANTHROPIC_BASE_URL)",
    )
    api_key_env: str | None = setting(
        None,
        "name of the env var holding the API key",
        flag="--api-key-env",
        unset="the provider's (`ctxprec providers`), e.g. OPENAI_API_KEY, GROQ_API_KEY",
    )
    temperature: float = setting(0.0, "sampling temperature of the judge")
    max_output_tokens: int = setting(200, "tokens the judge may write per call")
    timeout_s: float = setting(
        60.0,
        "seconds per judge call",
        flag="--timeout",
        rule=(lambda v: v > 0, "a positive number of seconds"),
    )
    max_retries: int = setting(
        6,
        "retries per judge call after a timeout, 429 or 5xx (a connection error is retried "
        "for --retry-budget instead)",
        flag="--max-retries",
        rule=(lambda v: v >= 0, "0 or more"),
    )
    retry_budget_s: float = setting(
        300.0,
        "seconds a call keeps retrying; a judge that accepts no connection is waited for this "
        "long, whatever --max-retries says (0: no retry)",
        flag="--retry-budget",
        rule=(lambda v: v >= 0, "0 or more seconds"),
        metavar="SECONDS",
    )
    max_unreadable_replies: int = setting(
        20,
        "stop the run (exit 4) once this many judge replies in a row held no readable verdict "
        "(a judge that answers in prose only): its items would each fail after paid re-asks; "
        "0: never stop",
        rule=(lambda v: v >= 0, "0 or more"),
    )
    backoff_base_s: float = setting(0.5, "first retry's backoff in seconds (then doubled)")
    backoff_max_s: float = setting(30.0, "longest backoff between retries, in seconds")
    structured_output: bool = setting(True, "ask for JSON by schema where the provider can")
    extra_headers: tuple[tuple[str, str], ...] = setting(
        (), "HTTP headers added to every judge request (a TOML table of strings)"
    )
    anthropic_version: str = setting("2023-06-01", "the anthropic-version header")
    max_reply_bytes: int = setting(
        4 << 20,
        "bytes read of one judge reply at most; a longer reply is a failed call, read no further",
        env="CTXPREC_MAX_REPLY_BYTES",
        rule=(lambda v: v >= 1024, "at least 1024"),
    )
    reasoning_effort: str | None = setting(
        None,
        "reasoning models: how hard to think (None: the lowest the model accepts)",
        choices=EFFORTS,
        unset="the lowest the model accepts",
        rule=(lambda v: v is None or v in EFFORTS, ", ".join(EFFORTS[:-1]) + " or max"),
    )
    mode: str = setting(
        "item",
        "one judge call per item or per row",
        flag="--mode",
        choices=("item", "row"),
        rule=(lambda v: v in ("item", "row"), '"item" (one call per context item) or "row"'),
    )
    verdict_only: bool = setting(
        False,
        "the judge answers relevant or not without a reason per item: fewer output tokens, "
        "the row reason still built from the verdicts (docs/cost.md)",
        env="CTXPREC_VERDICT_ONLY",
        flag="--verdict-only",
    )
    # a stronger judge on a sample: its verdicts are the reference of a corrected
    # estimate of the mean score (docs/estimates.md)
    audit_model: str | None = setting(
        None,
        "a second, stronger judge (provider/model) that also judges a seeded sample of whole "
        "rows: the summary then estimates what it would say of every row",
        env="CTXPREC_AUDIT_MODEL",
        flag="--audit-model",
        unset="no audit judge",
        metavar="MODEL",
    )
    audit_fraction: float = setting(
        0.05,
        "share of the rows the audit judge also judges (a hash of the row id and --audit-seed)",
        env="CTXPREC_AUDIT_FRACTION",
        flag="--audit-fraction",
        rule=(lambda v: 0 <= v <= 1, "between 0 and 1"),
        metavar="F",
    )
    audit_seed: int = setting(0, "seed of the audit sample", flag="--audit-seed")
    audit_base_url: str | None = setting(
        None,
        "the audit judge's base URL",
        env="CTXPREC_AUDIT_BASE_URL",
        flag="--audit-base-url",
        unset="--base-url when the audit model has --model's provider, else the provider's",
    )
    batch_api: bool = setting(
        False,
        "send the judge's calls through the provider's batch API (half price, up to 24 h)",
        flag="--batch-api",
    )
    batch_max_lines: int | None = setting(
        None,
        "requests per batch, at most (lowers the provider's limit; smaller batches end sooner)",
        env="CTXPREC_BATCH_MAX_LINES",
        rule=(_positive, "at least 1"),
        unset="the provider's (OpenAI 50,000, Anthropic 100,000)",
    )
    batch_max_bytes: int | None = setting(
        None,
        "bytes per batch file, at most (lowers the provider's limit)",
        env="CTXPREC_BATCH_MAX_BYTES",
        rule=(_positive, "at least 1"),
        unset="the provider's (OpenAI 200 MB, Anthropic 256 MB)",
    )
    batch_poll_s: float = setting(
        3.0,
        "seconds between the first polls of a batch (then doubled)",
        env="CTXPREC_BATCH_POLL_S",
        rule=(lambda v: v > 0, "a positive number of seconds"),
    )
    batch_poll_max_s: float = setting(
        60.0,
        "longest wait between two polls of a batch, in seconds",
        env="CTXPREC_BATCH_POLL_MAX_S",
        rule=(lambda v: v > 0, "a positive number of seconds"),
    )
    # [providers.NAME] tables of the config (added or overridden registry providers), as
    # (name, ((field, value), ...)) pairs; read by connectors/judges/catalog.py
    providers: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = setting(
        (), "providers added or changed by [providers.NAME] tables", unset="none"
    )


@dataclass(frozen=True, slots=True)
class LimitsSettings:
    """[limits]: calls in flight, requests and tokens per minute."""

    concurrency: int = setting(
        32,
        "judge calls in flight",
        env="CTXPREC_CONCURRENCY",
        flag="--concurrency",
        rule=(lambda v: v >= 1, "at least 1"),
    )
    rpm: float | None = setting(
        None,
        "requests per minute (all calls)",
        env="CTXPREC_RPM",
        flag="--rpm",
        rule=(_positive, "a positive number (or unset for no limit)"),
        unset="no limit",
    )
    tpm: float | None = setting(
        None,
        "tokens per minute (estimated before each call)",
        env="CTXPREC_TPM",
        flag="--tpm",
        rule=(_positive, "a positive number (or unset for no limit)"),
        unset="no limit",
    )
    adaptive: bool = setting(True, "do not slow down on 429 by itself", flag="--no-adaptive")


DEFAULT_EXPECTED = "expected_output"  # used when the input has it and [columns] expected is unset


DUPLICATE_POLICIES = ("refuse", "keep-first", "keep-last")  # [columns] duplicate_ids


@dataclass(frozen=True, slots=True)
class ColumnsSettings:
    """[columns]: which input column plays which role (`--map FIELD=COLUMN`)."""

    id: str = setting("id", "the row id column", flag="--map id=")
    query: str = setting("query", "the query column", flag="--map query=")
    expected: str | None = setting(
        None,
        f'expected output column; unset: `{DEFAULT_EXPECTED}` when present; "": none',
        flag="--map expected=",
        unset=DEFAULT_EXPECTED,
    )
    context: str = setting("contexts", "list<string> context column", flag="--map context=")
    labels: str | None = setting(
        None, "list<bool> human labels column", flag="--map labels=", unset="no labels"
    )
    extractor: str | None = setting(
        None,
        "function(row: dict) -> list[str] giving the context; wins over context",
        flag="--extractor",
        rule=(
            lambda v: v is None or ":" in v,
            '"module:function" or "path/to/file.py:function"',
        ),
        unset="none: the context column",
        metavar="MODULE:FUNCTION|FILE.py:FUNCTION",
    )
    duplicate_ids: str = setting(
        "refuse",
        "an id on several input rows: refuse the input (exit 2, before any judge call), or "
        "score one of its rows, the first or the last, and count the others as dropped",
        flag="--duplicate-ids",
        choices=DUPLICATE_POLICIES,
        rule=(lambda v: v in DUPLICATE_POLICIES, '"refuse", "keep-first" or "keep-last"'),
    )
    passthrough: tuple[str, ...] = setting(
        (),
        "columns copied to the output; COL=NEW renames one (e.g. score=upstream_score)",
        flag="--passthrough",
        rule=(_entries_ok, "COL or COL=NEW_NAME entries"),
        unset="none",
        metavar="COL[=NEW][,COL]",
    )
    # the trace context of the request a row logs (--otel events are parented to it): copied to
    # the output like a passthrough column
    trace_id: str | None = setting(
        None,
        "the column holding each row's OpenTelemetry trace id (32 hex digits)",
        flag="--map trace_id=",
        unset="none: events belong to the run's span",
    )
    span_id: str | None = setting(
        None,
        "the column holding each row's OpenTelemetry span id (16 hex digits)",
        flag="--map span_id=",
        unset="none",
    )

    @property
    def expected_explicit(self) -> bool:
        """The user named the expected column: it must then exist."""
        return self.expected is not None

    @property
    def map(self) -> ColumnMap:
        """The roles as the sources read them (passthrough parsed, extractor over context)."""
        expected = DEFAULT_EXPECTED if self.expected is None else self.expected or None
        renames = []
        passthrough = [*self.passthrough]
        for column in (self.trace_id, self.span_id):
            if column and column not in {p.partition("=")[0].strip() for p in passthrough}:
                passthrough.append(column)  # the events read it back from the output
        for entry in passthrough:
            source, sep, target = entry.partition("=")
            if sep:
                renames.append((source.strip(), target.strip()))
        return ColumnMap(
            id=self.id,
            query=self.query,
            expected=expected,
            context=None if self.extractor else self.context,
            labels=self.labels,
            passthrough=tuple(p.partition("=")[0].strip() for p in passthrough),
            renames=tuple(renames),
        )


_COLUMNS = ColumnsSettings()


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which source column plays which role, derived from [columns] (`ColumnsSettings.map`);
    `passthrough` columns are copied to the output, `renames` under another name."""

    id: str = _COLUMNS.id
    query: str = _COLUMNS.query
    expected: str | None = DEFAULT_EXPECTED  # may be absent: then judged vs the query alone
    context: str | None = _COLUMNS.context  # list<string>; None when an extractor gives it
    labels: str | None = _COLUMNS.labels  # optional list<bool> human labels
    passthrough: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()  # passthrough (source, output name) pairs

    def output_name(self, source: str) -> str:
        """The output column a passthrough source column is written as."""
        return dict(self.renames).get(source, source)


@dataclass(frozen=True, slots=True)
class ScoringSettings:
    """[scoring]: the score's scale, the row reason and the rank cut-offs."""

    scale: float = setting(
        1.0, "score scale", flag="--scale", rule=(lambda v: v >= 0, "zero or more")
    )
    reason: str = setting(
        "verdicts",
        "row reason built from the verdicts, or written by the judge (one more call per row)",
        flag="--reason",
        choices=("verdicts", "llm"),
        rule=(lambda v: v in ("verdicts", "llm"), '"verdicts" (built from verdicts) or "llm"'),
    )
    ks: tuple[int, ...] = setting(
        (1, 3, 5),
        "cut-offs for precision@k, hit@k, ndcg@k",
        flag="--ks",
        rule=(lambda v: bool(v) and all(k >= 1 for k in v), "a list of whole numbers >= 1"),
        metavar="K[,K]",
    )


DEFAULT_KS: tuple[int, ...] = ScoringSettings().ks  # the k of precision@k, hit@k and nDCG@k


@dataclass(frozen=True, slots=True)
class RunSettings:
    """[run]: batch size, the memo and its folder, the largest context item."""

    batch_rows: int = setting(
        1000,
        "rows per record batch / part file",
        env="CTXPREC_BATCH_ROWS",
        flag="--batch-rows",
        rule=(lambda v: v >= 1, "at least 1"),
    )
    cache_dir: Path | None = setting(  # noqa: RUF009 (a field, like dataclasses.field)
        None,
        "memo folder",
        env="CTXPREC_CACHE_DIR",
        flag="--cache-dir",
        unset="the user cache dir (ctxprec cache info shows it)",
    )
    memo: bool = setting(True, "do not read or write the memo", flag="--no-memo")
    max_item_chars: int = setting(200_000, "a longer context item is not sent to the judge")
    # the judge against itself: a seeded sample of items asked again, past the memo
    recheck: float = setting(
        0.0,
        "after scoring, ask the judge again (past the memo) about this share of the run's items "
        "and report its self-agreement (flip rate, kappa)",
        flag="--recheck",
        rule=(lambda v: 0 <= v <= 1, "between 0 and 1"),
        unset="no recheck",
        metavar="FRACTION",
    )
    recheck_seed: int = setting(0, "seed of the --recheck sample")
    # read from the environment before any command runs (and again from a config file, once a
    # command loads one): `ctxprec.cli.main`
    log_level: str | None = setting(
        None,
        "log to stderr at this level: debug, info or warning (API keys redacted)",
        env="CTXPREC_LOG_LEVEL",
        unset="no log",
    )
    debug: bool = setting(
        False, "print the traceback of an internal error (exit code 3)", env="CTXPREC_DEBUG"
    )


def _folder_name(column: str) -> bool:
    """A partition column's name is the first half of a folder name inside OUTDIR
    (`COL=value/`): it must not climb out of OUTDIR or start a path of its own."""
    return column not in ("", ".", "..") and not set(column) & set("/\\=\0")


@dataclass(frozen=True, slots=True)
class OutputSettings:
    """[output]: how the output is partitioned, extra sinks, the summary's breakdown."""

    partition_by: tuple[str, ...] = setting(
        (),
        "Hive-partition the output",
        flag="--partition-by",
        rule=(
            lambda v: all(_folder_name(c) for c in v) and len(set(v)) == len(v),
            "columns whose names can name a folder inside OUTDIR (each becomes COL=value/: "
            "no '/', '\\', '=', NUL, '.' or '..'), each named once",
        ),
        unset="not partitioned",
        metavar="COL[,COL]",
    )
    sinks: tuple[str, ...] = setting(
        (),
        "also append to a table: delta:PATH, duckdb:FILE.duckdb:TABLE or "
        "iceberg:CATALOG/NAMESPACE.TABLE",
        flag="--sink",
        unset="none",
        metavar="SPEC",
    )
    group_by: str | None = setting(
        None,
        "one column to break scores down by in the summary",
        flag="--group-by",
        rule=(
            lambda v: v is None or "," not in v,
            "one column (the summary breaks scores down by one)",
        ),
        unset="no grouping",
        metavar="COL",
    )
    charts: bool = setting(
        False,
        "also draw the summary's charts (charts/*.png) at the end of the run: matplotlib costs "
        "about 0.7 s of CPU a run; `ctxprec summary OUTDIR` draws them any time",
        flag="--charts",
    )


@dataclass(frozen=True, slots=True)
class GateSettings:
    """[gate]: the quality gate of `ctxprec score`."""

    fail_under: float | None = setting(
        None,
        "exit 5 when the mean score of the input's scored rows (scored by this run or an "
        "earlier one into OUTDIR) is below X; exit 7 when none is scored",
        flag="--fail-under",
        unset="no gate",
        metavar="X",
    )
    pass_empty: bool = setting(
        False,
        "a gate with no scored row to judge (an empty night) passes instead of exiting 7",
        flag="--pass-empty",
    )


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """[storage]: non-secret object-store settings; the clouds' own environment variables and
    files give the credentials (see storage/files/fs.py)."""

    endpoint_url: str | None = setting(
        None,
        "S3-compatible (MinIO, moto, R2), GCS or Azure endpoint",
        unset="the cloud's own (or AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST, ...)",
    )
    region: str | None = setting(
        None, "S3 region", unset="AWS_REGION / AWS_DEFAULT_REGION, else the bucket's"
    )
    anonymous: bool = setting(False, "public buckets: no credential lookup at all")


@dataclass(frozen=True, slots=True)
class MlflowSettings:
    """[mlflow]: one MLflow run per score run (per night with --incremental), logged once the
    output is complete; the tracking server's address and credentials are MLflow's own
    (MLFLOW_TRACKING_URI, MLFLOW_TRACKING_TOKEN, DATABRICKS_HOST, ...)."""

    enabled: bool = setting(
        False,
        "log the run to an MLflow experiment, one MLflow run per night (EXPERIMENT, else [mlflow] "
        "experiment, MLFLOW_EXPERIMENT_NAME or ctxprec; the server: MLFLOW_TRACKING_URI)",
        flag="--mlflow",
    )
    experiment: str | None = setting(
        None,
        "the MLflow experiment (created when missing)",
        env="MLFLOW_EXPERIMENT_NAME",
        unset="ctxprec",
        rule=(lambda v: v is None or bool(v.strip()), "a non-empty experiment name"),
    )
    tracking_uri: str | None = setting(
        None,
        "the tracking server (http://host:5000, databricks, sqlite:///mlflow.db)",
        env="MLFLOW_TRACKING_URI",
        unset="MLflow's own default",
    )
    timeout_s: float = setting(
        120.0,
        "seconds the logging may take at the end of a run; what is not logged then is kept in "
        "OUTDIR and logged by the next run",
        rule=(lambda v: v > 0, "a positive number of seconds"),
    )


@dataclass(frozen=True, slots=True)
class OtelSettings:
    """[otel]: one `gen_ai.evaluation.result` event per scored row and a span for the run, over
    OTLP/HTTP; where they go is OpenTelemetry's own OTEL_EXPORTER_OTLP_* variables (endpoint,
    headers, timeout, certificates) unless `endpoint` is set here."""

    enabled: bool = setting(
        False,
        "send one gen_ai.evaluation.result event per scored row and a span for the run over "
        "OTLP/HTTP (docs/tracking.md)",
        flag="--otel",
    )
    endpoint: str | None = setting(
        None,
        "the OTLP/HTTP base URL (/v1/logs and /v1/traces are added)",
        unset="OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318",
        rule=(
            lambda v: v is None or v.startswith(("http://", "https://")),
            "an http:// or https:// URL",
        ),
    )
    batch_events: int = setting(
        512,
        "events per export request (and the most held in memory at once)",
        rule=(lambda v: 1 <= v <= 100_000, "between 1 and 100000"),
    )
    timeout_s: float = setting(
        60.0,
        "seconds the export may take at the end of a run; rows not sent then are sent by the "
        "next run",
        rule=(lambda v: v > 0, "a positive number of seconds"),
    )


@dataclass(frozen=True, slots=True)
class Price:
    """[prices."provider/model"]: USD per million tokens for one model."""

    input_per_mtok: float
    output_per_mtok: float
    batch_input_per_mtok: float | None = None  # provider batch APIs; None: half the above
    batch_output_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None  # prompt tokens read from the provider's cache

    def usd(self, input_tokens: int, output_tokens: int, cached: int = 0) -> float:
        """What these tokens cost (full precision): `cached` of the input tokens at the
        cached-input price when there is one."""
        hits = min(cached, input_tokens) if self.cached_input_per_mtok is not None else 0
        total = (
            (input_tokens - hits) * self.input_per_mtok
            + hits * (self.cached_input_per_mtok or 0.0)
            + output_tokens * self.output_per_mtok
        )
        return float(total) / 1e6


SECTIONS: dict[str, type] = {
    "judge": JudgeSettings,
    "limits": LimitsSettings,
    "columns": ColumnsSettings,
    "scoring": ScoringSettings,
    "run": RunSettings,
    "output": OutputSettings,
    "gate": GateSettings,
    "storage": StorageSettings,
    "mlflow": MlflowSettings,
    "otel": OtelSettings,
}


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One field of one section, as the loader and the CLI see it."""

    key: str  # "limits.concurrency"
    section: str
    name: str
    default: Any
    help: str
    env: str | None
    flag: str | None
    choices: tuple[str, ...]
    rule: Rule | None
    unset: str
    metavar: str | None


def settings() -> Iterator[SettingSpec]:
    """Every setting of every section, in section and field order."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            m = f.metadata
            yield SettingSpec(
                f"{section}.{f.name}",
                section,
                f.name,
                f.default,
                m["help"],
                m["env"],
                m["flag"],
                m["choices"],
                m["rule"],
                m["unset"],
                m["metavar"],
            )


# how a setting is named in the messages of the layers below the public API: the CLI's flag and
# TOML entry, or, inside a call of the Python API, the option's name (`named_as_options`)
_AS_OPTIONS: ContextVar[bool] = ContextVar("ctxprec_settings_named_as_options", default=False)


def named(key: str, *, flag_only: bool = False) -> str:
    """A setting as the user gives it, for an error message: `--api-key-env / [judge]
    api_key_env` on the command line (`--api-key-env` with `flag_only`), `option
    'api_key_env'` inside the Python API (the model: its `model=` argument)."""
    section, _, name = key.partition(".")
    if _AS_OPTIONS.get():
        return "model=" if key == "judge.model" else f"option {name!r}"
    flag = next((s.flag for s in settings() if s.key == key), None)
    if flag and flag_only:
        return flag
    return f"{flag} / [{section}] {name}" if flag else f"[{section}] {name}"


@contextmanager
def named_as_options() -> Iterator[None]:
    """Within this block (and the tasks and threads it starts), `named` gives option names."""
    token = _AS_OPTIONS.set(True)
    try:
        yield
    finally:
        _AS_OPTIONS.reset(token)
