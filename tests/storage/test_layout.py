"""The OUTDIR layout is named in one module (storage/files/layout.py): no reader or writer joins a
path of it by hand, and each path it names lands where the product always put it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import ObjPath, out_path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("pipeline", "connectors", "storage")
LAYOUT = ROOT / "storage" / "files" / "layout.py"
# names only the layout may spell (a file or folder of OUTDIR, a compare folder or the memo)
NAMES = {
    "_ctxprec", "manifest.json", "run.json", "estimate.json", "_SUCCESS", "summary.json",
    "summary.md", "charts", "state.json", "batch-memo", "cache.db", "compare.json",
    "compare.md", "compare.png", "shuffle",
}  # fmt: skip
# joins with a literal that are not OUTDIR paths: the packaged example configs, the user cache
ALLOWED_JOINS = {
    ("pipeline/cli/config.py", "configs"),
    ("pipeline/cli/sample.py", "data"),  # package data, like the configs
    ("storage/memo/store.py", "memo"),
}


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _hand_joined(rel: str, source: str) -> list[str]:
    """Paths of the layout joined by hand in one module's source (`rel`: its path)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            text = _literal(node.right)
            if text is not None and (rel, text) not in ALLOWED_JOINS:
                found.append(f"{where}: path / {text!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            named = any(
                _literal(a) in NAMES or (_literal(a) or "").startswith("_ctxprec/")
                for a in node.args
            )
            if named and node.func.attr in ("join", "joinpath"):
                found.append(f"{where}: {node.func.attr}(...)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in NAMES or node.value.startswith(("_ctxprec/", "sink-")):
                found.append(f"{where}: {node.value!r}")
        elif isinstance(node, ast.Name | ast.alias):
            name = node.id if isinstance(node, ast.Name) else node.name
            if name == "STATE_DIR":
                found.append(f"{where}: STATE_DIR")
    return found


def test_no_outdir_path_is_joined_outside_the_layout_module() -> None:
    files = [p for pkg in PRODUCT for p in sorted((ROOT / pkg).rglob("*.py")) if p != LAYOUT]
    assert len(files) > 50
    found = [
        hit
        for path in files
        for hit in _hand_joined(path.relative_to(ROOT).as_posix(), path.read_text("utf-8"))
    ]
    assert found == [], "join these through storage/files/layout.py:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_hand_joined_path() -> None:
    source = (
        "from ctxprec.storage.files.layout import STATE_DIR\n"  # STATE_DIR
        'a = outdir / STATE_DIR / "run.json"\n'  # STATE_DIR, / 'run.json', 'run.json'
        'b = outdir / f"{key}.pending"\n'  # / '.pending'
        'c = fs.join(folder, "_ctxprec/manifest.json")\n'  # join(...), '_ctxprec/...'
        'd = resources.files("ctxprec") / "configs"\n'  # allowed in config_cmd.py only
    )
    assert len(_hand_joined("storage/x.py", source)) == 8
    assert len(_hand_joined("pipeline/cli/config.py", source)) == 7


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (layout.manifest, "_ctxprec/manifest.json"),
        (layout.run_info, "_ctxprec/run.json"),
        (layout.estimate, "_ctxprec/estimate.json"),
        (layout.lock, "_ctxprec/lock"),
        (layout.parts_dir, "_ctxprec/parts"),
        (layout.key_shards, "_ctxprec/verdicts/keys"),
        (layout.shuffle_root, "_ctxprec/shuffle"),
        (layout.batch_state, "_ctxprec/batches/state.json"),
        (layout.batch_memo, "_ctxprec/batch-memo"),
        (layout.success, "_SUCCESS"),
        (layout.summary_json, "summary.json"),
        (layout.summary_md, "summary.md"),
    ],
)
def test_paths_stay_where_earlier_versions_wrote_them(name, expected: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    local = name(tmp_path)
    assert isinstance(local, Path)
    assert local == tmp_path / expected
    remote = name(out_path("s3://bucket/out"))
    assert isinstance(remote, ObjPath)
    assert str(remote) == f"s3://bucket/out/{expected}"


def test_records_and_per_key_files(tmp_path: Path) -> None:
    assert layout.commit_record(tmp_path, "k1") == tmp_path / "_ctxprec/parts/k1.json"
    assert layout.pending_record(tmp_path, "k1") == tmp_path / "_ctxprec/parts/k1.pending"
    assert layout.verdict_dir(tmp_path, "ab") == tmp_path / "_ctxprec/verdicts/ab"
    assert layout.chart(tmp_path, "trend.png") == tmp_path / "charts/trend.png"
    assert layout.batch_file(tmp_path, "c1", ".ids") == tmp_path / "_ctxprec/batches/c1.ids"
    scratch = layout.shuffle_dir(tmp_path, "run1")
    assert scratch == tmp_path / "_ctxprec/shuffle/run1"
    assert (
        layout.shuffle_request_file(scratch, 3, 2, 1) == scratch / "keys/s00003/t000002-00001.arrow"
    )
    assert layout.shuffle_answer_file(scratch, 2, 3) == scratch / "answers/t000002/s00003.arrow"
    assert layout.MANIFEST_KEY == "_ctxprec/manifest.json"
