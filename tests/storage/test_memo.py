"""The memo key recipe and the diskcache store."""

from __future__ import annotations

from pathlib import Path

from storage.memo import Memo, judge_prefix, memo_key


def test_key_changes_with_everything_that_changes_a_verdict() -> None:
    p = judge_prefix({"provider": "openai", "model": "m", "temperature": 0.0})
    base = memo_key(p, "v1", "q", "e", "item")
    assert base == memo_key(p, "v1", "q", "e", "item")
    others = {
        memo_key(
            judge_prefix({"provider": "openai", "model": "m2", "temperature": 0.0}),
            "v1",
            "q",
            "e",
            "item",
        ),
        memo_key(
            judge_prefix({"provider": "openai", "model": "m", "temperature": 0.7}),
            "v1",
            "q",
            "e",
            "item",
        ),
        memo_key(p, "v2", "q", "e", "item"),
        memo_key(p, "v1", "q2", "e", "item"),
        memo_key(p, "v1", "q", None, "item"),
        memo_key(p, "v1", "q", "e", "item2"),
        memo_key(p, "v1", "qe", "", "item"),  # field boundaries cannot be shifted
    }
    assert base not in others
    assert len(others) == 7
    assert base.startswith("v1-")


def test_memo_roundtrip_and_no_eviction_policy(tmp_path: Path) -> None:
    memo = Memo(tmp_path / "m")
    assert memo.set_many([("a", (True, "r", 3, 1)), ("b", (False, "s", 2, 1))]) == 2
    assert memo.get_many(["a", "b", "c"]) == {"a": (True, "r", 3, 1), "b": (False, "s", 2, 1)}
    assert memo._cache.eviction_policy == "none"
    memo.close()
    again = Memo(tmp_path / "m")
    assert len(again) == 2
    again.close()
