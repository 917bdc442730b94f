"""Where everything lives in an output folder (OUTDIR), each path named once; every reader and
writer asks here (as simonw/llm names each of its paths once: `user_dir()`, `logs_db_path()`).
Works alike for a local `Path` and an object-store `ObjPath` (`ctxprec.storage.files.objpath`).
Modules are named from the `ctxprec` package down.

    OUTDIR/
      <part files>                      named by the commit records (`storage.outdir.commit`)
      summary.json, summary.md          `ctxprec summary` (`storage.report.summary`)
      summary.html                      the same as one self-contained page (`storage.report.html`)
      charts/<chart>.png
      _SUCCESS                          the run finished
      _ctxprec/                         ctxprec's own state (never the user's)
        manifest.json                   which run the folder holds (`storage.outdir.runlog`)
        run.json                        the run's figures and history
        estimate.json                   the estimate saved before the run
        sink-<digest>.json              what each sink has loaded (`run.publish`)
        mlflow.json                     the MLflow run of each night, runs not logged yet
        mlflow-pending/<night>/         the summary files of a night not logged yet
        otel.json                       the parts whose rows were sent as OpenTelemetry events
                                        (all three `storage.outdir.tracking`)
        lock                            the live writer (`storage.outdir.lock`)
        parts/<key>.json, <key>.pending commit and pending records (`storage.outdir.commit`)
        verdicts/<digest>/              the verdicts of one input file (`storage.outdir.verdicts`)
        verdicts/keys/                  verdicts by key shard (`storage.outdir.keyshards`)
        shuffle/<run>/keys|answers/     a keyed run's scratch (`storage.outdir.keyshards`)
        batches/state.json, <chunk>.jsonl|.ids, batch-memo/   batch API runs
        batches-audit/state.json, <chunk>.jsonl|.ids          the audit judge's batches
                                                              (both `storage.outdir.batches`)

Also named here: the files of a `ctxprec compare -o DIR` folder, the memo folder's database and
its verdict journals.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # the CLI asks for paths before it may load pyarrow (files.objpath)
    from ctxprec.storage.files.objpath import ObjPath, OutPath

__all__ = [
    "CHARTS",
    "CHART_FILES",
    "COMMITTED",
    "COMPARE_CHART",
    "COMPARE_FILES",
    "COMPARE_HTML",
    "COMPARE_JSON",
    "COMPARE_MD",
    "MANIFEST_KEY",
    "PENDING",
    "STATE_DIR",
    "TREND_CHART",
    "batch_file",
    "batch_memo",
    "batch_state",
    "batches_dir",
    "chart",
    "charts_dir",
    "commit_record",
    "compare_file",
    "estimate",
    "fixed_files",
    "frame_outdir",
    "frame_rows",
    "in_state_dir",
    "incremental_tag",
    "is_incremental_key",
    "is_journal_name",
    "is_part_file",
    "is_part_key",
    "journal_dir",
    "journal_name",
    "journal_new_name",
    "key_shards",
    "lock",
    "manifest",
    "memo_db",
    "mlflow_pending",
    "mlflow_state",
    "otel_state",
    "owned_state",
    "part_name",
    "parts_dir",
    "pending_record",
    "run_info",
    "scratch_verdicts",
    "shuffle_answer_file",
    "shuffle_answers",
    "shuffle_dir",
    "shuffle_request_file",
    "shuffle_requests",
    "shuffle_root",
    "sink_record",
    "sink_records",
    "state_dir",
    "success",
    "summary_files",
    "summary_html",
    "summary_json",
    "summary_md",
    "verdict_dir",
    "verdict_file",
    "verdicts_root",
]

P = TypeVar("P", Path, "ObjPath", "OutPath")  # a local folder keeps its type, as does a prefix

STATE_DIR = "_ctxprec"  # ctxprec's own folder inside an output folder
_MANIFEST = "manifest.json"
_RUN_INFO = "run.json"
_ESTIMATE = "estimate.json"
_REPORT_TEXTS = "report-texts.json"  # the texts of the rows summary.html opened
_SINK_PREFIX = "sink-"
_MLFLOW = "mlflow.json"
_MLFLOW_PENDING = "mlflow-pending"
_OTEL = "otel.json"
_LOCK = "lock"
_PARTS = "parts"
COMMITTED = ".json"  # parts/KEY.json: the part's files are complete
PENDING = ".pending"  # parts/KEY.pending: the part's files are being written
_VERDICTS = "verdicts"
_KEY_SHARDS = "keys"
_SHUFFLE = "shuffle"
_BATCHES = "batches"
_AUDIT_BATCHES = "batches-audit"  # --audit-model with --batch-api: the audit judge's own
_SUCCESS = "_SUCCESS"
_SUMMARY_JSON = "summary.json"
_SUMMARY_MD = "summary.md"
_SUMMARY_HTML = "summary.html"
CHARTS = "charts"
# the charts' file names (drawn by storage/report/charts.py) -> alt text in summary.md
CHART_FILES: dict[str, str] = {
    "score_distribution.png": "score distribution",
    "relevance_by_position.png": "relevance by position",
    "scores_by_group.png": "scores by group",
}
TREND_CHART = "trend.png"  # the per-night chart (storage/report/trend.py)
# the manifest relative to OUTDIR, for a listing that knows folders by their string names
MANIFEST_KEY = f"{STATE_DIR}/{_MANIFEST}"

COMPARE_JSON = "compare.json"
COMPARE_MD = "compare.md"
COMPARE_CHART = "compare.png"
COMPARE_HTML = "compare.html"
COMPARE_FILES = (COMPARE_JSON, COMPARE_MD, COMPARE_CHART, COMPARE_HTML)


# -- OUTDIR itself ---------------------------------------------------------------------------
def success(outdir: P) -> P:
    return outdir / _SUCCESS


def summary_json(outdir: P) -> P:
    return outdir / _SUMMARY_JSON


def summary_md(outdir: P) -> P:
    return outdir / _SUMMARY_MD


def summary_html(outdir: P) -> P:
    return outdir / _SUMMARY_HTML


def summary_files(outdir: P) -> list[P]:
    """summary.json, summary.md and summary.html: what a run's summary is (and what MLflow
    keeps of each night)."""
    return [outdir / name for name in (_SUMMARY_JSON, _SUMMARY_MD, _SUMMARY_HTML)]


def charts_dir(outdir: P) -> P:
    return outdir / CHARTS


def chart(outdir: P, name: str) -> P:
    return outdir / CHARTS / name


def fixed_files() -> set[str]:
    """The files ctxprec writes by fixed name into OUTDIR, relative to it (ours only in a
    folder that holds a manifest: `ctxprec.storage.outdir.ownership`)."""
    charts = (f"{CHARTS}/{name}" for name in (*CHART_FILES, TREND_CHART))
    return {_SUCCESS, _SUMMARY_JSON, _SUMMARY_MD, _SUMMARY_HTML, *charts}


# -- the state folder ------------------------------------------------------------------------
def state_dir(outdir: P) -> P:
    return outdir / STATE_DIR


def in_state_dir(rel: PurePath) -> bool:
    """Whether a path relative to OUTDIR lies in ctxprec's state folder."""
    return bool(rel.parts) and rel.parts[0] == STATE_DIR


def manifest(outdir: P) -> P:
    return outdir / STATE_DIR / _MANIFEST


def run_info(outdir: P) -> P:
    return outdir / STATE_DIR / _RUN_INFO


def estimate(outdir: P) -> P:
    return outdir / STATE_DIR / _ESTIMATE


def sink_record(outdir: P, digest: str) -> P:
    return outdir / STATE_DIR / f"{_SINK_PREFIX}{digest}.json"


def report_texts(outdir: P) -> P:
    """The query, expected output and items of the rows summary.html opened that the output
    does not hold, kept so that `ctxprec summary` can show them again."""
    return outdir / STATE_DIR / _REPORT_TEXTS


def mlflow_state(outdir: P) -> P:
    """The MLflow run of each night (the run's fingerprint) and the nights not logged yet."""
    return outdir / STATE_DIR / _MLFLOW


def mlflow_pending(outdir: P, night: str) -> P:
    """The copies of one night's summary files, kept until MLflow has them (`night`: a
    fingerprint, checked by the caller)."""
    return outdir / STATE_DIR / _MLFLOW_PENDING / night


def otel_state(outdir: P) -> P:
    """The parts whose rows were sent as OpenTelemetry events."""
    return outdir / STATE_DIR / _OTEL


def owned_state(outdir: P) -> list[P]:
    """The state files a new run replaces (--overwrite): manifest, run info, estimate, the
    sinks' records, the report's texts and the events sent; the verdicts (a memo), the MLflow
    runs of the nights (an --overwrite of the same night logs to the same MLflow run) and the
    lock stay."""
    state = outdir / STATE_DIR
    names = (_MANIFEST, _RUN_INFO, _ESTIMATE, _REPORT_TEXTS, _OTEL)
    found: list[P] = [state / name for name in names]
    found.extend(state.glob(f"{_SINK_PREFIX}*.json"))
    return found


def sink_records(outdir: P) -> list[P]:
    """The sinks' records (what each sink has loaded)."""
    return sorted((outdir / STATE_DIR).glob(f"{_SINK_PREFIX}*.json"), key=str)


def lock(outdir: P) -> P:
    return outdir / STATE_DIR / _LOCK


def parts_dir(outdir: P) -> P:
    return outdir / STATE_DIR / _PARTS


def commit_record(outdir: P, key: str) -> P:
    return outdir / STATE_DIR / _PARTS / f"{key}{COMMITTED}"


def pending_record(outdir: P, key: str) -> P:
    return outdir / STATE_DIR / _PARTS / f"{key}{PENDING}"


# a part's files: `part-KEY.parquet`, in Hive `col=value/` folders when partitioned
_PART_PREFIX = "part-"
_PART_SUFFIX = ".parquet"
_PART_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_HIVE_FOLDER = re.compile(r"[^/=\x00]+=[^/\x00]*")
_MAX_HIVE_DEPTH = 32


def part_name(key: str) -> str:
    """The stem of part KEY's files (`partition_tables` adds `.parquet` and the folders)."""
    return f"{_PART_PREFIX}{key}"


def is_part_key(key: str) -> bool:
    """A key ctxprec gives a part (records are named by it): no folder, no `..`."""
    return _PART_KEY.fullmatch(key) is not None and ".." not in key


def is_part_file(rel: str, key: str) -> bool:
    """Whether `rel` (relative to OUTDIR) is a file ctxprec writes for part `key`:
    `part-KEY.parquet`, in zero or more `col=value` folders."""
    *folders, name = rel.split("/")
    return (
        is_part_key(key)
        and name == f"{part_name(key)}{_PART_SUFFIX}"
        and len(folders) <= _MAX_HIVE_DEPTH
        and all(_HIVE_FOLDER.fullmatch(f) for f in folders)
    )


# an --incremental run commits its parts as `r<UTC time>-<batch key>`; a plain run as `<batch key>`
_INCREMENTAL_TAG = "r%Y%m%dT%H%M%S%f-"
_INCREMENTAL_KEY = re.compile(r"r\d{8}T\d{12}-")


def incremental_tag(moment: datetime) -> str:
    """The prefix of the part keys an --incremental run started at `moment` commits."""
    return moment.strftime(_INCREMENTAL_TAG)


def is_incremental_key(key: str) -> bool:
    """Whether a part key is one an --incremental run committed."""
    return _INCREMENTAL_KEY.match(key) is not None


def run_of_part(name: str) -> str:
    """Which run wrote the part file `name` (part-KEY.parquet): the --incremental run's tag, or
    "" for the parts of the run that is not incremental."""
    found = _INCREMENTAL_KEY.match(name.removeprefix(_PART_PREFIX))
    return found.group(0) if found else ""


# -- verdicts --------------------------------------------------------------------------------
def verdicts_root(outdir: P) -> P:
    """The folder of every verdict folder."""
    return outdir / STATE_DIR / _VERDICTS


def verdict_dir(outdir: P, digest: str) -> P:
    """The verdicts judged for one input file (`digest` names the file)."""
    return outdir / STATE_DIR / _VERDICTS / digest


def verdict_file(directory: P, name: str) -> P:
    """One append-only verdict file in a verdict folder."""
    return directory / f"{name}.arrow"


def key_shards(outdir: P) -> P:
    """The run's verdicts by key shard."""
    return outdir / STATE_DIR / _VERDICTS / _KEY_SHARDS


def shuffle_root(outdir: P) -> P:
    """Every keyed run's scratch folder: removed once a run's parts are all committed."""
    return outdir / STATE_DIR / _SHUFFLE


def shuffle_dir(outdir: P, run: str) -> P:
    return outdir / STATE_DIR / _SHUFFLE / run


def shuffle_requests(scratch: P, shard: int) -> P:
    """The request files of one key shard in a run's scratch folder."""
    return scratch / "keys" / f"s{shard:05d}"


def shuffle_request_file(scratch: P, shard: int, task: int, part: int) -> P:
    """One request file `t<task>-<part>.arrow` of a key shard
    (`ctxprec.storage.outdir.keyshards.task_of`)."""
    return shuffle_requests(scratch, shard) / f"t{task:06d}-{part:05d}.arrow"


def shuffle_answers(scratch: P, task: int) -> P:
    """The answer files of one task in a run's scratch folder."""
    return scratch / "answers" / f"t{task:06d}"


def shuffle_answer_file(scratch: P, task: int, shard: int) -> P:
    return shuffle_answers(scratch, task) / f"s{shard:05d}.arrow"


def scratch_verdicts(scratch: P) -> P:
    """A run's own verdicts by key shard, with the memo off."""
    return scratch / _VERDICTS


# -- batch API runs --------------------------------------------------------------------------
def batches_dir(outdir: P, audit: bool = False) -> P:
    """The first judge's batches, or (`audit`) the audit judge's: never mixed in one folder."""
    return outdir / STATE_DIR / (_AUDIT_BATCHES if audit else _BATCHES)


def batch_state(outdir: P, audit: bool = False) -> P:
    return batches_dir(outdir, audit) / "state.json"


def batch_file(outdir: P, chunk: str, suffix: str, audit: bool = False) -> P:
    """A chunk's request lines (`.jsonl`) or id map (`.ids`)."""
    return batches_dir(outdir, audit) / f"{chunk}{suffix}"


def batch_memo(outdir: P) -> P:
    """The verdicts a batch run collected, when the shared memo is off."""
    return outdir / STATE_DIR / "batch-memo"


# -- other folders ctxprec writes ------------------------------------------------------------
def compare_file(outdir: P, name: str) -> P:
    """One of COMPARE_FILES in a `ctxprec compare -o DIR` folder."""
    return outdir / name


def frame_rows(folder: Path) -> Path:
    """The rows of a `score_frame` call, written as Parquet in the temporary folder ctxprec
    makes for it (`ctxprec.frames`)."""
    return folder / "rows.parquet"


def frame_outdir(folder: Path) -> Path:
    """The output folder a `score_frame` call's run writes, in the same temporary folder."""
    return folder / "scored"


def memo_db(folder: Path) -> Path:
    """The database file in a memo folder (diskcache's)."""
    return folder / "cache.db"


def journal_dir(folder: Path) -> Path:
    """The verdict journals in a memo folder (`ctxprec.storage.memo.journal`): one per running paid
    run."""
    return folder / "journal"


JOURNAL_SUFFIX = ".jsonl"
JOURNAL_NEW = ".new-"  # a journal being created, not yet locked by its run
_JOURNAL_TOKEN = re.compile(r"[0-9a-f]{16}")  # `secrets.token_hex(8)`: a run's journal token


def journal_file(folder: Path, token: str) -> Path:
    """Run `token`'s journal in memo folder `folder`."""
    return journal_dir(folder) / journal_name(token)


def journal_new(folder: Path, token: str) -> Path:
    """Where run `token` creates its journal before it is locked and renamed."""
    return journal_dir(folder) / journal_new_name(token)


def journal_name(token: str) -> str:
    """The name of run `token`'s journal in the journal folder."""
    return f"{token}{JOURNAL_SUFFIX}"


def journal_new_name(token: str) -> str:
    """The name run `token`'s journal has while it is being created."""
    return f"{JOURNAL_NEW}{token}"


def is_journal_name(name: str) -> bool:
    """A journal's name (or a journal being created) as ctxprec gives them: nothing else in a
    journal folder is read or removed."""
    token = name.removesuffix(JOURNAL_SUFFIX) if name.endswith(JOURNAL_SUFFIX) else None
    if token is None and name.startswith(JOURNAL_NEW):
        token = name.removeprefix(JOURNAL_NEW)
    return token is not None and _JOURNAL_TOKEN.fullmatch(token) is not None
