"""`json.dumps` and `json.loads` as every judge call uses them, without their Python layers.

A judge call encodes one request body and decodes two JSON texts (the reply body, the verdict in
it). `json.dumps` goes through `JSONEncoder.encode` and `iterencode` (which defines a function
each time) before it reaches the C encoder; `json.loads` through `JSONDecoder.decode` and
`raw_decode` before the C scanner. These call the C code at once and give the same results:
`dumps` builds the encoder `json.dumps` builds with its defaults; `loads` takes the scanner's
reading of a text that is one JSON object (after it only JSON whitespace) and hands anything
else, errors included, to `json.loads` itself.
"""

from __future__ import annotations

import json
import json.encoder
from typing import Any

__all__ = ["dumps", "loads"]

# the C encoder and scanner (not in typeshed's stubs); None where CPython has no C accelerator
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_scan: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009
_ascii = json.encoder.encode_basestring_ascii  # json.dumps' string encoder (the C one if any)
_default = json.JSONEncoder().default  # what json.dumps calls for an unknown type: TypeError
_JSON_SPACE = " \t\n\r"


def dumps(value: Any) -> str:
    """`json.dumps(value)`, the same text."""
    if _c_make_encoder is not None and type(value) is dict:
        # the encoder json.dumps makes with its defaults: check_circular (a fresh markers
        # dict), ensure_ascii, no indent, separators ": " and ", ", unsorted, allow_nan
        encode = _c_make_encoder({}, _default, _ascii, None, ": ", ", ", False, False, True)
        return "".join(encode(value, 0))
    return json.dumps(value)


def loads(text: str) -> Any:
    """`json.loads(text)`: the same value, or the same error; a text nested too deeply for
    the scanner (a hostile reply: RecursionError in json.loads) is a ValueError like any
    other unreadable text."""
    try:
        if text[:1] == "{":
            try:
                value, end = _scan(text, 0)
            except (StopIteration, ValueError):
                pass  # not valid JSON: json.loads says why
            else:
                if end == len(text) or not text[end:].strip(_JSON_SPACE):
                    return value
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
