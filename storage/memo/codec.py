"""How the memo stores one verdict: a fixed binary layout, decoded field by field, never a pickle.

A memo folder may come from anyone who can write to it (a shared or copied folder, an OUTDIR),
so a stored value is untrusted data: it decodes to a verdict or it is not one (a miss, judged
again). The layout is 21 bytes of header and the reason as UTF-8 with no NUL character (so the
memo's batched read can join reasons with NUL and split them back: `ctxprec.storage.memo.store`):

    magic b"cpv2" | relevant: 1 byte, 0 or 1 | input tokens: u64 LE | output tokens: u64 LE | reason

Nothing in a value, and nothing in the row that holds it (diskcache's `mode`, `filename`),
chooses how it is decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from ctxprec.storage.core.constants import MAX_CALL_TOKENS
from ctxprec.storage.core.verdict import JudgeReply

__all__ = [
    "HEADER_COLUMNS",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_REASON_BYTES",
    "MAX_TOKENS",
    "MAX_VALUE_BYTES",
    "MemoEntry",
    "decode_columns",
    "decode_entry",
    "encode_entry",
    "entry_of",
]

# (relevant, reason, input_tokens, output_tokens): read its fields by name
# (ctxprec.storage.memo.store)
MemoEntry = tuple[bool, str, int, int]

_HEADER: Final = struct.Struct("<4sBQQ")
MAGIC: Final = b"cpv2"
HEADER_SIZE: Final = _HEADER.size
MAX_REASON_BYTES: Final = 32_000  # a judge's reason is clipped to 1,000 characters; an LLM row
# reason is prose of a few sentences: a longer value is not one of ours
MAX_VALUE_BYTES: Final = HEADER_SIZE + MAX_REASON_BYTES
# a stored count past what one judge call may report is not one of ours (a planted 2**56 - 1 in
# each verdict made a summary of 20 rows show 1.4 x 10^18 tokens): that value is not a verdict
MAX_TOKENS: Final = MAX_CALL_TOKENS


def entry_of(reply: JudgeReply) -> MemoEntry:
    """A judge's reply for one item as the memo keeps it."""
    v = reply.verdict
    return (v.relevant, v.reason, reply.input_tokens, reply.output_tokens)


def _tokens(n: int) -> int:
    return min(max(int(n), 0), MAX_TOKENS)


def encode_entry(entry: MemoEntry) -> bytes:
    """The stored form of a verdict. A reason past MAX_REASON_BYTES is clipped (at a character);
    a lone surrogate (which no UTF-8 text holds) becomes "?", a NUL U+FFFD."""
    relevant, reason, tokens_in, tokens_out = entry
    raw = reason.replace("\x00", "\ufffd").encode("utf-8", "replace")
    if len(raw) > MAX_REASON_BYTES:
        raw = raw[:MAX_REASON_BYTES].decode("utf-8", "ignore").encode()
    return _HEADER.pack(MAGIC, 1 if relevant else 0, _tokens(tokens_in), _tokens(tokens_out)) + raw


def decode_entry(value: object) -> MemoEntry | None:
    """The verdict a stored value holds; None when it is not one (wrong type, length, magic,
    flag, token count or UTF-8)."""
    if type(value) is not bytes or not HEADER_SIZE <= len(value) <= MAX_VALUE_BYTES:
        return None
    magic, relevant, tokens_in, tokens_out = _HEADER.unpack_from(value)
    if magic != MAGIC or relevant > 1 or tokens_in > MAX_TOKENS or tokens_out > MAX_TOKENS:
        return None
    try:
        reason = value[HEADER_SIZE:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in reason:
        return None
    return (relevant == 1, reason, tokens_in, tokens_out)


HEADER_COLUMNS: Final = _HEADER  # a batch's headers back to back, read field by field


def decode_columns(headers: bytes, reasons: bytes, n: int) -> Iterator[MemoEntry] | None:
    """`n` entries from their headers back to back and their reasons joined by NUL, decoded in C
    (`struct.iter_unpack`, one UTF-8 decode, one split) and checked as `decode_entry` checks one
    value (magic, flag, token counts), a field at a time over the whole batch; None when one of
    them is not a verdict's or the two do not make `n` entries (a forged value: read those rows
    one by one instead)."""
    if len(headers) != n * HEADER_SIZE:
        return None
    if not n:
        return iter(())
    try:
        texts = reasons.decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        return None
    if len(texts) != n:
        return None
    magics, flags, tokens_in, tokens_out = zip(*HEADER_COLUMNS.iter_unpack(headers), strict=True)
    if magics.count(MAGIC) != n or max(flags) > 1:
        return None
    if max(tokens_in) > MAX_TOKENS or max(tokens_out) > MAX_TOKENS:
        return None
    return zip(map(bool, flags), texts, tokens_in, tokens_out, strict=True)
