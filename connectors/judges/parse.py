"""Tolerant reading of a judge's reply text into verdicts (JSON, fenced JSON, yes/no prose).
It reads only the model's reply, never the prompt, so context item text cannot steer parsing.
A verdict is never guessed: a prose reply gives one clear answer or it is unreadable (re-asked,
then failed). Words that answer both ways ("Yes - not relevant", "Relevant? No", "yes and no"),
a hedge ("Relevant: not really") or a control character make it unreadable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from ctxprec.connectors.judges import jsonfast
from ctxprec.storage.core.errors import JudgeParseError
from ctxprec.storage.core.verdict import Verdict

__all__ = ["VERDICT_KEYS", "parse_row_verdicts", "parse_verdict"]

VERDICT_KEYS = (
    "relevant", "is_relevant", "verdict", "answer", "relevance", "label", "decision", "judgment",
)  # fmt: skip
_REASON_KEYS = ("reason", "explanation", "rationale")
_TRUE = frozenset({"yes", "y", "true", "relevant", "1"})
_FALSE = frozenset({"no", "n", "false", "not relevant", "not_relevant", "irrelevant", "0"})
_NO_REASON = "(no reason given)"
# a reason is one sentence: what a judge writes past this is not kept (the memo, the output)
MAX_REASON_CHARS = 1000

_TOKEN = (
    r"(not[\s_-]+relevant\b|irrelevant\b|relevant\b|yes\b|no\b|true\b|false\b|[01](?=$|[\s,:;)\-]))"
)
# A verdict word at the very start, optionally as "Relevant: no" / "Verdict: yes", after markup.
_LEAD = re.compile(
    r"^[\s*_#>\"'`(\[-]*(?:(?:relevant|is_relevant|verdict|answer)[*_\"'`]*\s*[:=]\s*)?"
    r"[\s*_\"'`]*" + _TOKEN,
    re.IGNORECASE,
)
# "yes/no", "yes or no", "Yes No": a second, contradicting verdict word right after the first.
_SECOND = re.compile(r"^[\s*_\"'`]*(?:/|\||\bor\b)?[\s*_\"'`]*" + _TOKEN, re.IGNORECASE)
_WHOLE_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)
_REASON_LEAD = re.compile(r"^[\s\-–—:,.;)*_\"'`]+")

# -- one clear answer: what the words of a prose reply say about relevance
# C0/C1 controls but tab and newlines, and bidi controls: no honest verdict holds them
_CONTROL = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
# what the judge quotes is not what it says (an item's text, a JSON key): left out of the reading
_QUOTED = re.compile(r'```.*?```|`[^`]*`|"[^"]*"|“[^”]*”|«[^»]*»', re.DOTALL)
# a clause: the words between punctuation; a negation reaches the verdict word of its clause
_CLAUSES = re.compile(r"[.,;:!?()\[\]{}<>/|—–]+|\s-+\s")
_WORDS = re.compile(r"[a-z]+(?:['’][a-z]+)?|[01]\b")
_YES = frozenset({"yes", "yeah", "yep", "true", "relevant"})
_NO = frozenset({"no", "nope", "false", "irrelevant", "nonrelevant"})
_FLIPS = frozenset({"true", "false", "relevant", "irrelevant"})  # "not relevant", "isn't true"
_NEGATORS = frozenset({"not", "never", "no", "hardly", "barely", "nor", "neither", "without"})
_HEDGES = frozenset({
    "maybe", "perhaps", "possibly", "partially", "partly", "somewhat", "arguably", "unclear",
    "unsure", "uncertain", "borderline", "ambiguous", "debatable", "kinda", "sorta", "mixed",
    "really", "likely", "unlikely", "probably", "depends", "mostly", "slightly", "marginally",
})  # fmt: skip
# a hedge right after the leading word ("Relevant: kind of", "Yes, fairly"), as well as _HEDGES
_NEAR_HEDGES = _HEDGES | {"kind", "sort", "fairly", "moderately", "semi", "half", "somehow"}
_NEXT = re.compile(
    r"([\W_]*?)(?:\b(?:and|or|but|yet|though|although)\b[\W_]*)?([a-z]+(?:['’][a-z]+)?)"
)
_BARE_ONLY = frozenset({"true", "false", "0", "1"})  # answers only alone or before punctuation
_AMBIGUOUS = 0  # a stance: a hedge on a verdict word ("partially relevant", "Yes, maybe")


def _negated(word: str) -> bool:
    return word in _NEGATORS or word.endswith(("n't", "n’t"))


def _stances(text: str) -> set[int]:
    """The answers the verdict words of `text` give, quoted text left out: 1 (yes, relevant,
    not irrelevant), -1 (no, false, not relevant), _AMBIGUOUS (a hedged verdict word)."""
    found: set[int] = set()
    text = _QUOTED.sub(" ", text.lower()).replace("non-relevant", "nonrelevant")
    for clause in _CLAUSES.split(text):
        words = _WORDS.findall(clause)
        for i, word in enumerate(words):
            if word in _YES:
                stance = 1
            elif word in _NO:
                stance = -1
            else:
                continue
            before = words[max(0, i - 3) : i]
            if word in _FLIPS and any(map(_negated, before)):
                stance = -stance
            if word in _FLIPS and any(w in _HEDGES for w in words[max(0, i - 2) : i]):
                stance = _AMBIGUOUS
            found.add(stance)
    return found


def _next_word(rest: str) -> tuple[str, str]:
    """The separator after a leading verdict word and the word after it (past a joining word:
    "yes and no", "Yes, but not"), lower case."""
    match = _NEXT.match(rest.lower())
    return (match.group(1), match.group(2)) if match else (rest, "")


def _one_answer(value: bool, rest: str) -> bool:
    """Whether `rest`, the reply after its leading verdict word, keeps that one answer: no
    verdict word answering otherwise (a quoted one aside), no hedge or negation right after a
    yes ("Yes - not relevant", "Relevant: not really"), no answer to the word as a question
    ("Relevant? No", "Irrelevant: no")."""
    sep, word = _next_word(_QUOTED.sub(" ", rest))
    stance = 1 if value else -1
    if word in _YES or word in _NO or _negated(word) or word in _NEAR_HEDGES:
        if any(c in sep for c in ":=?(") or word in _NEAR_HEDGES:
            return False
        if (word in _NO or _negated(word)) != (stance == -1):
            return False
    return _stances(rest) <= {stance}


def _to_bool(value: Any) -> bool | None:
    """true/false, "yes"/"no", "relevant"/"not relevant", 1/0; None when it is none of them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = " ".join(value.strip().strip(".!").lower().split())
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return None


def _reason_of(obj: dict[str, Any]) -> str:
    for key in _REASON_KEYS:
        value = obj.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()[:MAX_REASON_CHARS]
    return _NO_REASON


def _from_mapping(obj: dict[str, Any]) -> Verdict | None:
    """The verdict of a JSON object with a verdict key; None when it has no such key.
    A one-element {"verdicts": [{...}]} (the per-row shape, as Mastra replies) counts too."""
    lowered = {str(k).lower(): v for k, v in obj.items()}
    inner = lowered.get("verdicts")
    if isinstance(inner, list) and len(inner) == 1 and isinstance(inner[0], dict):
        lowered = {str(k).lower(): v for k, v in inner[0].items()}
    key = next((k for k in VERDICT_KEYS if k in lowered), None)
    if key is None:
        return None
    value = _to_bool(lowered[key])
    if value is None:
        raise JudgeParseError(f"verdict {key}={lowered[key]!r} is neither yes nor no")
    return Verdict(value, _reason_of(lowered))


def _whole_json(text: str) -> Any:
    """The reply as one JSON value (bare or as one fenced block); None when it is not."""
    fenced = _WHOLE_FENCE.match(text)
    try:
        return jsonfast.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return None


def _top_level_objects(text: str) -> Iterator[tuple[dict[str, Any], int, int]]:
    """JSON objects embedded in prose or fences, left to right, with where each starts and
    ends; nested objects are skipped."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except RecursionError:
            return  # nested too deeply to be a verdict (a hostile reply): nothing more to find
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            yield obj, start, end
        start = text.find("{", end)


def _leading(text: str) -> Verdict | None:
    match = _LEAD.match(text)
    if match is None:
        return None
    token = match.group(1)
    value = _to_bool(token)
    rest = text[match.end() :]
    if token.lower() in _BARE_ONLY and rest.lstrip(" *_\"'`")[:1].isalnum():
        return None  # "True to its title, ...": a word of a sentence, not an answer
    second = _SECOND.match(rest)
    if value is None or (second is not None and _to_bool(second.group(1)) != value):
        raise JudgeParseError(f"ambiguous reply: {_clip(text)!r}")
    if not _one_answer(value, rest):
        raise JudgeParseError(f"no one clear answer in reply: {_clip(text)!r}")
    return Verdict(value, _REASON_LEAD.sub("", rest).strip()[:MAX_REASON_CHARS] or _NO_REASON)


def _clip(text: str) -> str:
    return " ".join(text.split())[:120]


def _schema_reply(text: str) -> Verdict | None:
    """The reply structured output asks for, exactly {"relevant": <bool>, "reason": <text>} (or
    {"relevant": <bool>}, verdict-only): the verdict the general reading below gives it, without
    its passes; None for anything else."""
    try:
        obj = jsonfast.loads(text)
    except ValueError:
        return None
    if type(obj) is not dict:
        return None
    relevant = obj.get("relevant")
    if len(obj) == 1:
        return Verdict(relevant, _NO_REASON) if type(relevant) is bool else None
    if len(obj) != 2:
        return None
    reason = obj.get("reason")
    if type(relevant) is not bool or type(reason) is not str or not reason.strip():
        return None
    return Verdict(relevant, reason.strip()[:MAX_REASON_CHARS])


def parse_verdict(text: str) -> Verdict:
    """Read one verdict. Order: the whole reply as JSON (bare or fenced); a verdict word at the
    start ("Yes - ...", "Relevant: no"); else the FIRST top-level JSON object with a verdict key.

    Why this order and why the first object: the model is told to answer with JSON, so a
    structured answer opens the reply; objects further on are most likely quoted material (an
    item saying '{"relevant": true}') and must not override the answer. A leading verdict word
    beats embedded JSON for the same reason. An unreadable value in that first object fails
    rather than falling through to a later object.
    """
    stripped = (text or "").strip()
    if not stripped:
        raise JudgeParseError("empty reply")
    if stripped[0] == "{" and (found := _schema_reply(stripped)) is not None:
        return found
    return _general_verdict(stripped)


def _general_verdict(stripped: str) -> Verdict:
    """`parse_verdict`'s passes after the exact schema reply, on a stripped non-empty reply."""
    whole = _whole_json(stripped)
    if isinstance(whole, dict) and (found := _from_mapping(whole)) is not None:
        return found
    if whole is not None and not isinstance(whole, dict | list):
        value = _to_bool(whole)
        if value is not None:
            return Verdict(value, _NO_REASON)
    if _CONTROL.search(stripped):
        raise JudgeParseError(f"control characters in reply: {_clip(stripped)!r}")
    found = _leading(stripped)
    if found is not None:
        return found
    for obj, start, end in _top_level_objects(stripped):
        found = _from_mapping(obj)
        if found is not None:
            # the prose around the object must not answer otherwise (nor another object)
            if not _stances(stripped[:start] + " . " + stripped[end:]) <= {found.relevant * 2 - 1}:
                raise JudgeParseError(f"no one clear answer in reply: {_clip(stripped)!r}")
            return found
    raise JudgeParseError(f"no verdict in reply: {_clip(stripped)!r}")


def _row_entries(text: str) -> list[Any]:
    whole = _whole_json(text)
    if isinstance(whole, list):
        return whole
    candidates = [whole] if isinstance(whole, dict) else [o for o, _, _ in _top_level_objects(text)]
    for obj in candidates:
        entries = obj.get("verdicts")
        if isinstance(entries, list):
            return entries
    raise JudgeParseError(f'no {{"verdicts": [...]}} list in reply: {_clip(text)!r}')


def _entry(entry: Any) -> tuple[int | None, Verdict]:
    if isinstance(entry, dict):
        verdict = _from_mapping(entry)
        index = entry.get("index")
        if verdict is not None:
            return (index if isinstance(index, int) else None), verdict
    value = _to_bool(entry)
    if value is None:
        raise JudgeParseError(f"row verdict {_clip(json.dumps(entry))!r} has no readable verdict")
    return None, Verdict(value, _NO_REASON)


def parse_row_verdicts(text: str, n_items: int) -> list[Verdict]:
    """Read per-row verdicts, one per item in item order; any count mismatch fails the call.
    Indices, when every entry has one, must be exactly 0..n-1 (or 1..n) and set the order."""
    entries = [_entry(e) for e in _row_entries((text or "").strip())]
    if len(entries) != n_items:
        raise JudgeParseError(f"expected {n_items} verdicts, got {len(entries)}")
    indices = [index for index, _ in entries]
    if all(index is not None for index in indices):
        ordered = sorted(entries, key=lambda e: e[0] or 0)
        found = [index for index, _ in ordered]
        if found not in (list(range(n_items)), list(range(1, n_items + 1))):
            raise JudgeParseError(f"verdict indices {found} do not number {n_items} items")
        entries = ordered
    return [verdict for _, verdict in entries]
