"""Credentials a URL can carry, removed from text ctxprec writes or prints: user:password@ and
the values of query parameters named like credentials (?api-key=..., &token=..., &sig=...).
Standard library only: the judges' `secrets.redact` and the OUTDIR's state files both use it.
"""

from __future__ import annotations

import re

__all__ = ["without_url_secrets"]

_USERINFO = re.compile(r"//[^/@\s]+@")
# a URL's query values that are credentials by their name (?api-key=..., &token=..., &sig=...)
_QUERY_SECRET = re.compile(
    r"(?i)([?&](?:api[-_]?key|key|token|access[-_]?token|auth|sig|signature|secret|password"
    r"|code)=)[^&#\s'\"]+"
)


def without_url_secrets(text: str) -> str:
    """`text` with every URL's user:password@ and credential-named query values as ***."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub("//***@", text))
