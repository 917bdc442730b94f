"""What each model family accepts, before the first call, and what a rejection asks us to change.

`openai_shape` / `anthropic_shape` give the request shape a model name calls for (reasoning models
get no `temperature`, `max_completion_tokens`, their lowest `reasoning_effort` and room to reason;
Anthropic models from Opus 4.7 on get no `temperature`). The shape is one mutable object per
judge, shared by every call of the run: when a server rejects a parameter, `learn_openai` /
`learn_anthropic` change it once and every later (and every in-flight) call is built from it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ctxprec.connectors.judges import jsonfast

__all__ = [
    "EFFORTS",
    "OUTPUT_LADDER",
    "ErrorFields",
    "RequestShape",
    "anthropic_shape",
    "error_fields",
    "learn_anthropic",
    "learn_openai",
    "openai_shape",
]

# reasoning_effort values, lowest first (openai-python's ReasoningEffort literal, plus vLLM's)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# structured output, strictest first: each rejection steps one rung down, for the whole run
OUTPUT_LADDER = ("json_schema", "json_object_schema", "json_object", "text")
REASONING_ROOM = 8192  # completion tokens left for reasoning on top of the visible answer
BUDGET_CAP = 65536  # no completion budget above this, however often a reply is cut off
_VERSIONS = itertools.count(1)


@dataclass
class RequestShape:
    """What this run sends. Changed only through `learn_*` (and the budget), never per call."""

    send_temperature: bool = True
    tokens_field: str = "max_tokens"
    reasoning_effort: str | None = None
    reasoning: bool = False
    output: str = "json_schema"
    system_in_user: bool = False  # o1-mini/o1-preview take no system message
    budget_factor: int = 1
    dropped: set[str] = field(default_factory=set)  # replaced, never changed in place
    # a number no other state of any shape had: what a judge builds from the shape (openai's
    # request-body template) is kept per version
    version: ClassVar[int] = 0

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "version", next(_VERSIONS))

    def budget(self, visible: int) -> int:
        room = REASONING_ROOM if self.reasoning else 0
        return min((visible + room) * self.budget_factor, BUDGET_CAP)

    def describe(self) -> dict[str, object]:
        """What is sent, for run.json and the summary."""
        return {
            "temperature": "sent" if self.send_temperature else "not sent",
            "tokens_field": self.tokens_field,
            "reasoning_effort": self.reasoning_effort,
            "structured_output": self.output,
            "budget_factor": self.budget_factor,
            "dropped": sorted(self.dropped),
        }


def _bare(name: str) -> str:
    return name.strip().lower().rsplit("/", 1)[-1]


def openai_shape(model: str, structured: bool, effort: str | None) -> RequestShape:
    """The first request shape for an OpenAI model name (any OpenAI-compatible server's model
    names that match no family get the classic shape: temperature, max_tokens)."""
    name = _bare(model)
    shape = RequestShape(output="json_schema" if structured else "text")
    if re.match(r"o1-(mini|preview)", name):  # the first reasoning models: no effort, no system
        shape.reasoning, shape.system_in_user = True, True
    elif re.match(r"o\d", name):
        shape.reasoning, shape.reasoning_effort = True, "low"
    elif name.startswith("gpt-5") and "chat" not in name:
        shape.reasoning = True
        minor = re.match(r"gpt-5\.(\d+)", name)
        if "pro" in name:
            shape.reasoning_effort = "high" if minor is None else "medium"
        elif "codex" in name:
            shape.reasoning_effort = "low"
        else:  # gpt-5, -mini, -nano: minimal; gpt-5.1 and later: none
            shape.reasoning_effort = "minimal" if minor is None else "none"
    if shape.reasoning:
        shape.send_temperature = False
        shape.tokens_field = "max_completion_tokens"
        if effort is not None:
            shape.reasoning_effort = effort
    elif effort is not None:
        shape.reasoning_effort = effort
    return shape


def anthropic_shape(model: str) -> RequestShape:
    """Claude models from Opus 4.7 (and every 5.x) reject temperature/top_p/top_k."""
    name = _bare(model)
    shape = RequestShape(output="text")
    found = re.match(r"claude-(?:opus|sonnet|haiku)-(\d+)(?:-(\d{1,2}))?(?:-|$|@)", name)
    if found is None:
        found = re.match(r"claude-(\d+)(?:[-.](\d{1,2}))?-(?:opus|sonnet|haiku)", name)
    if found is not None:
        version = (int(found.group(1)), int(found.group(2) or 0))
        if version >= (4, 7):
            shape.send_temperature = False
    return shape


# ---------------------------------------------------------------- reading a rejection


@dataclass(frozen=True)
class ErrorFields:
    """The fields of a provider error body, whatever its shape (all lower-cased text)."""

    type: str = ""
    code: str = ""
    param: str = ""
    message: str = ""
    text: str = ""  # the whole body, lower-cased


def error_fields(body: str) -> ErrorFields:
    """OpenAI {"error": {message, type, param, code}}, Anthropic {"type":"error","error":{type,
    message}}, vLLM {"error": "Unauthorized"}, integer or string codes, HTML: never raises."""
    try:
        data: Any = jsonfast.loads(body)
    except ValueError:
        data = None
    err = data.get("error", data) if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return ErrorFields(message=str(err or "").lower(), text=body.lower())

    def text(key: str) -> str:
        value = err.get(key)
        return "" if value is None else str(value).lower()

    return ErrorFields(text("type"), text("code"), text("param"), text("message"), body.lower())


_NAMED = re.compile(
    r"(?:unsupported|unknown|unrecognized|invalid)\s+(?:parameter|value|request argument"
    r"(?: supplied)?)\s*:?\s*'?([a-z_][\w.]*)'?"
)
_NO_FORMAT = re.compile(
    r"'response_format' is not supported|(?:unsupported|unknown|unrecognized) (?:parameter|"
    r"request argument)[^']*'response_format'[^.]"
)
_SUPPORTED = re.compile(r"supported values are:?\s*(.*)")
_NEVER_DROPPED = frozenset({"model", "messages", "system", "max_tokens", "max_completion_tokens"})


def _named_param(f: ErrorFields) -> str:
    if f.param and f.param not in ("null", "none", "messages"):
        return f.param
    found = _NAMED.search(f.message) or _NAMED.search(f.text)
    return found.group(1) if found else ""


def _step_output(shape: RequestShape, f: ErrorFields) -> str | None:
    rung = OUTPUT_LADDER.index(shape.output)
    if rung + 1 >= len(OUTPUT_LADDER):
        return None
    nxt = OUTPUT_LADDER[rung + 1]
    if shape.output == "json_object_schema" and "response_format.schema" in f.text:
        nxt = "json_object"  # a server that knows json_object but not the schema sibling
    if _NO_FORMAT.search(f.text):
        nxt = "text"  # the server takes no response_format at all
    shape.output = nxt
    return f"structured output: {nxt} (the server rejected {OUTPUT_LADDER[rung]})"


def learn_openai(
    shape: RequestShape, status: int, body: str, payload: dict[str, Any]
) -> str | None:
    """Change `shape` so the rejected request would be accepted; a one-line description of the
    change, or None when the rejection is not about the request's shape."""
    if not (400 <= status < 600) or status in (401, 403, 404, 408, 409, 429):
        return None
    f = error_fields(body)
    if "context_length" in f.code or "maximum context length" in f.text:
        return None
    param = _named_param(f)
    about_format = "response_format" in f.text or "json_schema" in f.text or "json_object" in f.text
    if "response_format" in payload and (about_format or param.startswith("response_format")):
        return _step_output(shape, f)
    if status >= 500 and not _NAMED.search(f.text):
        return None  # a server fault, not a rejected shape
    if param == "temperature" and "temperature" in payload:
        shape.send_temperature = False
        return "temperature: not sent (the model accepts only its default)"
    if param == "max_tokens" or ("max_tokens" in payload and "max_completion_tokens" in f.text):
        shape.tokens_field = "max_completion_tokens"
        return "max_completion_tokens sent instead of max_tokens"
    if param == "max_completion_tokens" and "max_completion_tokens" in payload:
        shape.tokens_field = "max_tokens"
        return "max_tokens sent instead of max_completion_tokens"
    if param == "reasoning_effort" and "reasoning_effort" in payload:
        return _learn_effort(shape, f)
    if param in payload and param not in _NEVER_DROPPED:
        shape.dropped = shape.dropped | {param}
        return f"{param}: not sent (the server rejects it)"
    if "system" in f.text and "role" in f.text and not shape.system_in_user:
        shape.system_in_user = True
        return "system prompt sent inside the user message (the model takes no system role)"
    return None


def _learn_effort(shape: RequestShape, f: ErrorFields) -> str:
    listed = _SUPPORTED.search(f.message)
    offered = re.findall(r"'(\w+)'", listed.group(1)) if listed else []
    choices = [e for e in EFFORTS if e in offered and e != shape.reasoning_effort]
    if choices:
        shape.reasoning_effort = choices[0]
        return f"reasoning_effort: {choices[0]} (the lowest the model accepts)"
    shape.reasoning_effort = None
    return "reasoning_effort: not sent (the model rejects it)"


def learn_anthropic(
    shape: RequestShape, status: int, body: str, payload: dict[str, Any]
) -> str | None:
    """`temperature` deprecated for the model, or not together with `top_p`: stop sending it."""
    if status != 400:
        return None
    f = error_fields(body)
    if "temperature" in payload and "temperature" in f.message:
        shape.send_temperature = False
        return "temperature: not sent (the model rejects it)"
    for key in ("top_p", "top_k"):
        if key in payload and key in f.message:
            shape.dropped = shape.dropped | {key}
            return f"{key}: not sent (the model rejects it)"
    return None
