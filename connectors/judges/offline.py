"""The built-in offline judge (the default): a deterministic lexical heuristic, not an LLM.

Needs no network and no key; a free baseline that spots answer-bearing and query-named items.

How an item is judged (the first rule that fires wins; texts are lower-cased, accent-folded and
split into words first, so case and punctuation never matter):

1. Answer containment (only with an expected output): the expected output, minus leading
   articles, occurs in the item as a whole-word phrase. Skipped when the answer cannot tell
   items apart: yes/no/true/false, fewer than 3 characters, only stopwords, or already in the
   query ("Who is older, A or B?" -> "A": every item about A contains it).
2. Subject named by the query: the item's subject is its first line when that looks like a
   title ("Title\ntext", at most 120 characters, a trailing "(...)" qualifier dropped), else its
   opening words before "is/was/are/were", "(" or ",". Relevant when the query names that
   subject as a whole name: the phrase occurs in the query and, if the query is written in mixed
   case, is capitalised there and is not just part of a longer capitalised name ("Apple
   dumpling" inside "The Apple Dumpling Gang" does not count).
3. Query phrase overlap: the query's adjacent word pairs (except stopword-stopword pairs) are
   looked up in the item; relevant when at least PHRASE_THRESHOLD of them (and at least
   MIN_PHRASE_HITS) occur. Single shared words are not counted: retrievers already return items
   sharing the query's words, so they barely separate relevant from irrelevant items.

Without an expected output, rules 2 and 3 decide alone. Nothing is learnt from labels: the rules
restate the criterion ("directly contributes information needed for the expected output") in
string-matching terms. The one fitted number is PHRASE_THRESHOLD = 0.6, the best of 0.3..0.8 on
the even rows of a 500-question HotpotQA sample and checked on the odd rows (figures: README,
bench/offline_accuracy.py); MIN_PHRASE_HITS = 2 only guards very short queries. The first half /
second half split of that sample is bridge / comparison questions, so its halves differ by type.
Variants: "offline" (default), "offline/strict" (no rule 3), "offline/lenient" (threshold 0.4).
Bump HEURISTIC_VERSION whenever a rule, a constant or the stopword list changes (memo keys).

An item cannot talk its way to "relevant": its text is only searched for the query's and the
expected output's words, never read as instructions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, pairwise

from ctxprec.connectors.judges.base import ItemRequest, JudgeStats, Throttle
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.core.verdict import JudgeReply, Verdict

__all__ = [
    "HEURISTIC_VERSION",
    "MIN_PHRASE_HITS",
    "PHRASE_THRESHOLD",
    "VARIANTS",
    "OfflineJudge",
]

HEURISTIC_VERSION = "offline-v2"
PHRASE_THRESHOLD = 0.6  # share of the query's word pairs found in the item (rule 3)
MIN_PHRASE_HITS = 2  # and at least this many of them
MIN_ANSWER_CHARS = 3  # shorter answers ("no", "7", "UK") are too common to count (rule 1)
MAX_TITLE_CHARS = 120  # a first line longer than this is text, not a title (rule 2)
TERM_SHARE = 0.5  # share of a sentence answer's own key terms found in the item (rule 1b)
MIN_SENTENCE_TOKENS = 5  # an expected output this long is a sentence, not a short answer
MAX_SUBJECT_TOKENS = 8  # a lead-derived subject longer than this is a clause, not a name

# variant -> phrase threshold (None: rule 3 off)
VARIANTS: dict[str, float | None] = {"": PHRASE_THRESHOLD, "strict": None, "lenient": 0.4}

_ASCII_TOKEN_RE = re.compile(r"[a-z0-9]+")
# Scripts written without spaces (CJK, kana) become one token per character, so phrase matching
# still works there; every other script splits on non-word characters.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")
_CJK_RE = re.compile(rf"[{_CJK}]")
_MARKS_RE = re.compile(r"[\u0300-\u036f]+")
_PAREN_TAIL_RE = re.compile(r"\s*\([^()]*\)\s*$")
_SPACES_RE = re.compile(b"  +")
_LEAD_RE = re.compile(r"\W*(.{2,80}?)\s*(?:\(|,|;|\bis\b|\bwas\b|\bare\b|\bwere\b)")

_LEADING_ARTICLES = frozenset({"the", "a", "an"})
_NON_ANSWERS = frozenset({"yes", "no", "true", "false", "none", "unknown", "n a", "na"})

# General English function words plus question words; no domain vocabulary.
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each either few for
    from further had has have having he her here hers herself him himself his how i if in into is
    it its itself just me more most my myself neither no nor not now of off on once only or other
    our ours ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up upon very was we
    were what whats when where which while who whom whose whos why will with would you your yours
    yourself yourselves s t d ll m re ve
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _tokens(text: str) -> list[str]:
    """Lower-cased, accent-folded word tokens (plain ASCII takes the fast path)."""
    low = text.lower()
    if low.isascii():
        return _ASCII_TOKEN_RE.findall(low)
    return _TOKEN_RE.findall(_MARKS_RE.sub("", unicodedata.normalize("NFKD", low)))


def _phrase(tokens: Sequence[str]) -> str:
    """Space-padded phrase key: `key in padded_text` is a whole-word phrase match."""
    return " " + " ".join(tokens) + " "


# `_padded(text)` is `_phrase(_tokens(text))` computed without making a string per token (the
# judge's hot spot: every item is tokenized). Separators become spaces with one C-level
# `bytes.translate`, runs of spaces are then folded into one. Texts whose lower case is not
# ASCII go through the same NFKD as `_tokens`; their non-ASCII characters, a handful of
# distinct ones in most texts, are mapped one by one (`_NonAscii`) by the rules of `_TOKEN_RE`:
# a combining mark is dropped (`_MARKS_RE`), a CJK character is a token of its own, a word
# character is kept and anything else separates. tests/connectors/test_offline_judge.py checks
# the equality on every code point and on real texts.
def _ascii_table(fold: bool) -> bytes:
    """bytes.translate table: a-z and 0-9 kept, A-Z lowered when `fold` (else kept: after NFKD
    they are `_TOKEN_RE` word characters as they are), every other ASCII byte a space; bytes of
    multi-byte UTF-8 characters (>= 0x80) kept."""
    table = bytearray(range(256))
    for c in range(128):
        if chr(c).isupper():
            table[c] = c + 32 if fold else c
        elif not (chr(c).islower() or chr(c).isdigit()):
            table[c] = 32
    return bytes(table)


_FOLD = _ascii_table(fold=True)
_KEEP_CASE = _ascii_table(fold=False)
_ASCII = bytes(range(128))
_MAX_CHAR_CACHE = 50_000
_MAX_REPLACED = 12  # distinct non-ASCII characters mapped one `replace` each; more: `_tokens`


class _NonAscii(dict[str, bytes]):
    """What each non-ASCII character (of NFKD text) becomes in a padded text, filled on use."""

    def __missing__(self, char: str) -> bytes:
        raw = char.encode("utf-8", "surrogatepass")
        if _MARKS_RE.fullmatch(char):
            out = b""
        elif _TOKEN_RE.fullmatch(char) is None:
            out = b" "
        elif _CJK_RE.fullmatch(char):
            out = b" " + raw + b" "
        else:
            out = raw
        if len(self) < _MAX_CHAR_CACHE:
            self[char] = out
        return out


_NON_ASCII = _NonAscii()


def _padded(text: str) -> str:
    """`_phrase(_tokens(text))`: the text's tokens, space-separated and space-padded."""
    if text.isascii():
        data = text.encode("ascii").translate(_FOLD)
    else:
        low = text.lower()
        if low.isascii():
            data = low.encode("ascii").translate(_FOLD)
        else:
            data = unicodedata.normalize("NFKD", low).encode("utf-8", "surrogatepass")
            others = set(data.translate(None, _ASCII).decode("utf-8", "surrogatepass"))
            if len(others) > _MAX_REPLACED:  # one pass per character would cost more
                return _phrase(_tokens(text))
            for char in others:
                raw, new = char.encode("utf-8", "surrogatepass"), _NON_ASCII[char]
                if new != raw:
                    data = data.replace(raw, new)
            data = data.translate(_KEEP_CASE)
    data = _SPACES_RE.sub(b" ", b" " + data + b" ")
    return data.decode("utf-8", "surrogatepass") if len(data) > 1 else "  "


def _quote(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


@dataclass(frozen=True, slots=True)
class _Query:
    """Everything about (query, expected) that all items of a row share; built once per row."""

    padded: str  # " tok tok ... " of the query
    tokens: tuple[str, ...]
    capitalised: tuple[bool, ...]
    cased: bool  # the query uses capitals beyond its first word: trust capitalisation
    pair_keys: tuple[str, ...]  # padded phrase keys of the word pairs, for rule 3 ...
    pair_words: tuple[str, ...]  # ... and the pairs as shown in a reason
    of_pairs: str  # " of N query word pairs"
    answer: str | None  # padded answer phrase when rule 1 applies
    answer_display: str
    answer_note: str  # why rule 1 was skipped ("" when it applies)
    note_capitalised: str  # the same, capitalised: the start of a reason
    # rule 1b: a sentence answer's content words absent from the query, (word, padded key)
    terms: tuple[tuple[str, str], ...] = ()


@lru_cache(maxsize=4096)
def _prepare(query: str, expected: str | None) -> _Query:
    tokens = tuple(_tokens(query))
    # The same tokens with their original case, to see which words the query capitalises.
    plain = query if query.isascii() else _MARKS_RE.sub("", unicodedata.normalize("NFKD", query))
    raw = _TOKEN_RE.findall(plain)
    if len(raw) == len(tokens):
        capitalised = tuple(w[:1].isupper() for w in raw)
    else:  # exotic case folding changed the token count: do not trust capitals
        capitalised = (False,) * len(tokens)
    cased = any(capitalised[1:])

    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for a, b in pairwise(tokens):
        if a in _STOPWORDS and b in _STOPWORDS:
            continue
        key = f" {a} {b} "
        if key not in seen:
            seen.add(key)
            pairs.append((key, f"{a} {b}"))

    padded_query = _phrase(tokens)
    answer: str | None = None
    display = ""
    note = ""
    if expected is not None:
        display = _quote(expected)
        ans = _tokens(expected)
        while ans and ans[0] in _LEADING_ARTICLES:
            ans = ans[1:]
        joined = " ".join(ans)
        if not ans or all(t in _STOPWORDS for t in ans):
            note = f"the expected output {display} has no content words to look for"
        elif joined in _NON_ANSWERS:
            note = f"a yes/no answer ({display}) is not looked for"
        elif len(joined) < MIN_ANSWER_CHARS:
            note = f"the expected output {display} is too short to look for"
        elif _phrase(ans) in padded_query:
            note = f"the expected output {display} is already in the query"
        else:
            answer = _phrase(ans)
            note = f"it lacks the expected answer {display}"
    terms: tuple[tuple[str, str], ...] = ()
    if expected is not None:
        ans_tokens = _tokens(expected)
        if len(ans_tokens) >= MIN_SENTENCE_TOKENS:
            in_query = set(tokens)
            terms = tuple((t, f" {t} ") for t in dict.fromkeys(
                t for t in ans_tokens
                if t not in _STOPWORDS and t not in in_query and (len(t) >= 3 or t.isdigit())
            ))  # fmt: skip
    return _Query(
        terms=terms,
        padded=padded_query,
        tokens=tokens,
        capitalised=capitalised,
        cased=cased,
        pair_keys=tuple(key for key, _ in pairs),
        pair_words=tuple(words for _, words in pairs),
        of_pairs=f" of {len(pairs)} query word pairs",
        answer=answer,
        answer_display=display,
        answer_note=note,
        note_capitalised=note[:1].upper() + note[1:],
    )


def _subject(item: str) -> str | None:
    """What the item is about: its title line, else its opening words (a name in most texts)."""
    head, sep, rest = item.partition("\n")
    if sep and rest and not rest.isspace() and 0 < len(head.strip()) <= MAX_TITLE_CHARS:
        return (_PAREN_TAIL_RE.sub("", head) if ")" in head else head).strip()
    match = _LEAD_RE.match(item, 0, 120)
    if match is None:
        return None
    lead = match.group(1).strip()
    if _padded(lead).count(" ") - 1 > MAX_SUBJECT_TOKENS:  # its number of tokens
        return None
    return lead


def _names_subject(q: _Query, subject: str) -> bool:
    """True when the query names `subject` as a whole name (rule 2)."""
    key = _padded(subject)
    if len(key) <= 2 or key not in q.padded:  # no words, or not in the query (fast reject)
        return False
    wanted = tuple(key[1:-1].split(" "))
    if all(t in _STOPWORDS for t in wanted):
        return False
    if not q.cased:
        return True
    toks, caps = q.tokens, q.capitalised
    n = len(wanted)
    for i in range(len(toks) - n + 1):
        if toks[i : i + n] != wanted:
            continue
        if not any(caps[i : i + n]):
            continue  # written in lower case: a common noun, not a name
        if i > 1 and caps[i - 1] and toks[i - 1] not in _STOPWORDS:
            continue  # only part of a longer capitalised name
        j = i + n
        if j < len(toks) and caps[j] and toks[j] not in _STOPWORDS:
            continue
        return True
    return False


class OfflineJudge:
    """Deterministic heuristic judge (see the module docstring); free, instant, no network."""

    def __init__(
        self, model_name: str, settings: JudgeSettings, throttle: Throttle, stats: JudgeStats
    ) -> None:
        variant = model_name.strip().lower()
        if variant == "default":
            variant = ""
        if variant not in VARIANTS:
            known = ", ".join("offline" + (f"/{v}" if v else "") for v in VARIANTS)
            raise ConfigError(f"unknown offline judge variant {model_name!r}; use one of: {known}")
        self.model = "offline" + (f"/{variant}" if variant else "")
        self.phrase_threshold: float | None = VARIANTS[variant]
        self.settings = settings
        self.throttle = throttle  # unused: nothing to rate-limit
        self.stats = stats

    def identity(self) -> dict[str, object]:
        return {
            "provider": "offline",
            "model": self.model,
            "heuristic": HEURISTIC_VERSION,
            "phrase_threshold": self.phrase_threshold,
            "min_phrase_hits": MIN_PHRASE_HITS,
            "min_answer_chars": MIN_ANSWER_CHARS,
            "max_title_chars": MAX_TITLE_CHARS,
            "max_subject_tokens": MAX_SUBJECT_TOKENS,
            "term_share": TERM_SHARE,
            "min_sentence_tokens": MIN_SENTENCE_TOKENS,
        }

    def decide(self, query: str, expected: str | None, item: str) -> Verdict:
        """The verdict for one item: the synchronous core of `judge_item`; verdict-only
        (`[judge] verdict_only`) keeps no reason, as an LLM judge asked for none gives none."""
        verdict = self._decide(query, expected, item)
        return Verdict(verdict.relevant, "") if self.settings.verdict_only else verdict

    def _decide(self, query: str, expected: str | None, item: str) -> Verdict:
        q = _prepare(query, expected)
        padded = _padded(item)

        if q.answer is not None and q.answer in padded:
            return Verdict(True, f"Contains the expected answer {q.answer_display}.")

        if q.terms:
            present = [t for t, key in q.terms if key in padded]
            if present and len(present) >= TERM_SHARE * len(q.terms):
                listed = ", ".join(present[:5]) + (", …" if len(present) > 5 else "")
                return Verdict(
                    True,
                    f"Holds {len(present)} of {len(q.terms)} key terms of the expected "
                    f"output ({listed}).",
                )

        subject = _subject(item)
        if subject is not None and _names_subject(q, subject):
            return Verdict(True, f"It is about {_quote(subject)}, which the query names.")

        hits = list(compress(q.pair_words, map(padded.__contains__, q.pair_keys)))
        n = len(hits)
        if n:
            shared = f"{n}{q.of_pairs} (" + ", ".join(hits[:4]) + (", …)" if n > 4 else ")")
        else:
            shared = f"0{q.of_pairs}"
        threshold = self.phrase_threshold
        if threshold is not None and n >= MIN_PHRASE_HITS and n >= threshold * len(q.pair_keys):
            return Verdict(True, f"Shares {shared} with the query.")

        # "<why not rule 1>, its subject '…' is not named in the query and it shares only …"
        note = q.note_capitalised
        if subject is not None:
            named = f"s subject {_quote(subject)} is not named in the query and it shares only"
            text = f"{note}, it{named} {shared}." if note else f"It{named} {shared}."
        else:
            text = f"{note} and it shares only {shared}." if note else f"It shares only {shared}."
        return Verdict(False, text)

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        self.stats.requests += 1
        return JudgeReply(self.decide(request.query, request.expected, request.item))

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        """Per-row mode: the same per-item verdicts (no cross-item statistics, by design)."""
        self.stats.requests += 1
        return [JudgeReply(self.decide(query, expected, item)) for item in items]

    async def write_reason(self, prompt: str) -> str:
        """The offline judge writes no prose: it answers "", and callers keep the reason built
        from the verdicts (runs stay deterministic)."""
        return ""

    async def aclose(self) -> None:
        return None
