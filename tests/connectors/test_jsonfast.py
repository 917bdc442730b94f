"""The judge's JSON shortcuts give exactly what `json.dumps` / `json.loads` give, errors too; the
OpenAI judge's request-body template follows every change of the request shape."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from ctxprec.connectors.judges import JudgeStats, NullThrottle, jsonfast
from ctxprec.connectors.judges.openai import OpenAIJudge
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.core.settings import JudgeSettings

_VALUES: list[Any] = [
    {},
    {"a": 1, "b": [1.5, -0.0, 1e300, None, True, False], "c": {"d": "<x> & 'y'"}},
    {"text": 'é ü \u2028 \x00 \ud83d\ude00 "quoted" \\ back'},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf},
    {"nested": [{"k": [[], {}]}, "s"], 3: "int key", 2.5: "float key", None: "null key"},
    {"model": "gpt", "messages": [{"role": "system", "content": "x" * 5000}], "max_tokens": 200},
    [1, 2, 3],  # not a dict: json.dumps itself
    "just text",
]


@pytest.mark.parametrize("value", _VALUES)
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert jsonfast.dumps(value) == json.dumps(value)


def test_dumps_fails_as_json_dumps_fails() -> None:
    for bad in ({"x": object()}, {"x": {1, 2}}, {(1, 2): "tuple key"}):
        with pytest.raises(TypeError) as ours:
            jsonfast.dumps(bad)
        with pytest.raises(TypeError) as theirs:
            json.dumps(bad)
        assert str(ours.value) == str(theirs.value)
    circular: dict[str, Any] = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        jsonfast.dumps(circular)
    assert jsonfast.dumps({"after": "a failure"}) == '{"after": "a failure"}'


_TEXTS = [
    '{"a": 1}',
    '{"a": 1}\n',
    '{\n  "a": [1, 2.5, null, true],\n  "b": {"c": "d"}\n}\n \t\r',
    ' {"leading": "space"}',
    '{"a": 1} trailing',
    '{"a": 1}{"b": 2}',
    '{"a": 1',
    '{"a": NaN, "b": -Infinity}',
    '{"a": "\x01 control"}',
    '{"a": "\\ud83d\\ude00"}',
    "\ufeff{}",
    "{}\u00a0",
    "[1, 2]",
    '"text"',
    "",
    "<html>bad gateway</html>",
    '{"dup": 1, "dup": 2}',
]


@pytest.mark.parametrize("text", _TEXTS)
def test_loads_reads_what_json_loads_reads(text: str) -> None:
    try:
        expected: Any = ("value", json.loads(text))
    except ValueError as err:
        expected = ("error", type(err), str(err))
    try:
        got: Any = ("value", jsonfast.loads(text))
    except ValueError as err:
        got = ("error", type(err), str(err))
    assert repr(got) == repr(expected)  # repr: NaN != NaN


async def test_the_request_template_follows_every_shape_change() -> None:
    keys = Seams(keys=lambda name: "sk-test")
    judge = OpenAIJudge("gpt-4o", JudgeSettings(), NullThrottle(), JudgeStats(), seams=keys)
    schema = ("verdict", {"type": "object"})
    messages = [{"role": "user", "content": "u"}]

    def body() -> dict[str, Any]:
        return judge._payload("sys", messages, schema, 200)

    def fresh() -> dict[str, Any]:
        return judge._build("sys", messages, schema, 200)

    first = body()
    assert json.dumps(first) == json.dumps(fresh())
    assert list(first)[:2] == ["model", "messages"]
    again = body()
    assert again is not first
    assert again["messages"] is not first["messages"]
    changes = [
        lambda s: setattr(s, "send_temperature", False),
        lambda s: setattr(s, "tokens_field", "max_completion_tokens"),
        lambda s: setattr(s, "output", "json_object_schema"),
        lambda s: setattr(s, "reasoning_effort", "low"),
        lambda s: setattr(s, "dropped", s.dropped | {"max_completion_tokens"}),
        lambda s: setattr(s, "output", "text"),
        lambda s: setattr(s, "system_in_user", True),
    ]
    seen = {json.dumps(first)}
    for change in changes:
        change(judge.shape)
        sent = json.dumps(body())
        assert sent == json.dumps(fresh())
        assert sent not in seen  # each change shows in the very next body
        seen.add(sent)
    row = ("verdicts", {"type": "array"})
    assert json.dumps(judge._payload("s", messages, row, 300)) == json.dumps(
        judge._build("s", messages, row, 300)
    )
    await judge.aclose()
