"""Seeded samples drawn by hashing: a thing is in the sample when the SHA-256 of its text falls
below `fraction` of the hash space, so the same text is chosen on every run and machine. Used
for `--recheck` (items by memo key) and `--audit-model` (whole rows by id)."""

from __future__ import annotations

import hashlib

__all__ = ["in_sample"]


def in_sample(text: str, fraction: float) -> bool:
    """Whether `text` (the seed and what is sampled, as the caller spells them) is drawn in a
    sample of `fraction`: never at 0 or below, always at 1 or above."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64
