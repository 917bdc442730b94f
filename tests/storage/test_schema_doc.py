"""The README documents every output column with its type, in order: a drift test."""

from __future__ import annotations

import re

import pyarrow as pa

from ctxprec.storage.outdir.schema import SCHEMA_VERSION, output_schema
from tests.fakes.inputs import documentation

_ROW = re.compile(r"^\| `([a-z_{}]+)` \| ([^|]+) \|")
_TYPES = {
    "float64": pa.float64(),
    "string": pa.string(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
    "list<bool>": pa.list_(pa.bool_()),
    "list<string>": pa.list_(pa.string()),
    "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
}


def _documented() -> list[tuple[str, str]]:
    text = documentation()
    section = text.split(f"## Schema (version {SCHEMA_VERSION})", 1)[1].split("\n## ", 1)[0]
    return [
        (m.group(1), m.group(2).strip()) for line in section.splitlines() if (m := _ROW.match(line))
    ]


def _expand(ks: tuple[int, ...]) -> list[tuple[str, str]]:
    rows = []
    for name, kind in _documented():
        if "{k}" in name:
            rows += [(name.replace("{k}", str(k)), kind) for k in ks]
        else:
            rows.append((name, kind))
    return rows


def test_readme_documents_every_column_in_order_with_its_type() -> None:
    ks = (1, 3, 5)
    schema = output_schema(pa.string(), [], ks, labels=True, audit=True)
    documented = _expand(ks)
    # precision/hit/ndcg are documented once per metric, written per k: compare as sets there
    assert [n for n, _ in documented if "_at_" not in n] == [
        f.name for f in schema if "_at_" not in f.name
    ]
    assert {n for n, _ in documented if "_at_" in n} == {f.name for f in schema if "_at_" in f.name}
    for name, kind in documented:
        field = schema.field(name)
        base = re.sub(r",? not null$", "", kind.split(" (")[0].strip())
        if name == "id":
            assert "string or integer" in kind
            continue
        assert _TYPES[base] == field.type, name
        assert ("not null" in kind) == (not field.nullable), name


def test_schema_version_is_in_the_metadata() -> None:
    meta = output_schema().metadata
    assert meta[b"ctxprec.schema_version"] == SCHEMA_VERSION.encode()
