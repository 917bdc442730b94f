"""The verdict record: what a judge says about one context item, and what saying it cost.

Judges return it, the memo stores it (as a `MemoEntry` tuple), the flow and the per-row API
score from it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JudgeReply", "Verdict"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One context item's verdict: relevant or not, with the judge's one-sentence reason."""

    relevant: bool
    reason: str


@dataclass(frozen=True, slots=True)
class JudgeReply:
    """A verdict plus what it cost."""

    verdict: Verdict
    input_tokens: int = 0
    output_tokens: int = 0
