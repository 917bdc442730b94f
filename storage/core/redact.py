"""Credentials a URL can carry, removed from text ctxprec writes or prints: user:password@,
the values of query parameters named like credentials (?api-key=..., &token=..., &sig=...) and
fragments (#...).
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

# a URL's fragment (#...): never sent to a server, so whatever it holds is the user's own
_FRAGMENT = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s#'\"]*)#[^\s'\"]*")


def without_url_secrets(text: str) -> str:
    """`text` with every URL's user:password@, credential-named query values and fragment
    as ***."""
    text = _QUERY_SECRET.sub(r"\1***", _USERINFO.sub("//***@", text))
    return _FRAGMENT.sub(r"\1#***", text) if "#" in text else text
