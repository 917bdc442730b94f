"""API keys and what keeps them out of every log: keys come from the environment only, each one
is remembered so `redact` can scrub it (and auth header values, and key-shaped tokens) from any
text, and `RedactingFilter` rewrites every record of the ctxprec loggers through `redact`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit

from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.redact import without_url_secrets
from ctxprec.storage.core.settings import named

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "api_key_from_env",
    "checked_base_url",
    "is_loopback",
    "redact",
    "redacted_headers",
    "register_secret",
]

REDACTED = "***"

_SECRETS: set[str] = set()
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"(?i)((?:proxy-)?authorization|x-api-key|api-key)(['\"]?\s*[:=]\s*['\"]?)"
            r"(?:bearer\s+)?[^'\",\s}]+"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{6,}"), "Bearer " + REDACTED),
    (re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-]{8,}"), REDACTED),
)


def register_secret(value: str | None) -> None:
    """Remember a key's exact value so `redact` removes it wherever it shows up."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """Remove known keys, auth header values, key-shaped tokens (sk-...) and URL credentials
    (user:password@, ?api-key=...) from text."""
    # a copy (another thread may register a key meanwhile), longest first: a key that holds
    # another registered one (sk-test in sk-test-...) is removed whole, not its tail left over
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return without_url_secrets(text)


def checked_base_url(url: str, source: str) -> str:
    """`url` when it carries no user:password@ (refused: ctxprec sends the key from the
    environment in the provider's auth header, and aiohttp cannot send both) and no fragment
    (refused: a fragment is never sent to a server, and the endpoint's path would be appended
    to it, `…/v1#x/chat/completions`); the values of credential-named query parameters
    (?api-key=...) are remembered for `redact`."""
    if "#" in url:
        shown = without_url_secrets(url.partition("#")[0])
        raise ConfigError(
            f"the base URL from {source} ({shown}#…) has a fragment (#…), which no server is "
            "sent and which would end up inside the request's path: give the URL without it"
        )
    try:
        parts = urlsplit(url)
        has_userinfo = parts.username is not None or parts.password is not None
    except ValueError as exc:
        raise ConfigError(f"the base URL from {source} is not a URL: {exc}") from exc
    if has_userinfo:
        raise ConfigError(
            f"the base URL from {source} ({without_url_secrets(url)}) carries user:password@; "
            f"ctxprec sends the API key from the environment ({named('judge.api_key_env')}) in "
            "the provider's auth header: give the URL without it"
        )
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if without_url_secrets(f"?{name}=x") != f"?{name}=x":
            register_secret(value)
    return url


def redacted_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers with every auth header's value replaced, fit for a debug log."""
    return {k: REDACTED if k.lower() in _SECRET_HEADERS else v for k, v in headers.items()}


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (and traceback text) through `redact`, its control
    characters escaped (`printable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg, record.args = printable(redact(record.getMessage()), lines=True), None
        except (TypeError, ValueError):  # a malformed log call: let the handler report it
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def _install_redaction() -> None:
    # A logger's filters only see records logged on that very logger, not its children's,
    # so the filter goes on "ctxprec" (the product's logger) and on "ctxprec.http" (where the
    # judges log).
    for name in ("ctxprec", "ctxprec.http"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


_install_redaction()


def is_loopback(url: str) -> bool:
    """True for localhost / 127.x / ::1 base URLs (local vLLM, Ollama: no key needed)."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from_env(env_name: str, base_url: str, model: str) -> str | None:
    """The key from `env_name`; missing is a ConfigError unless the server is on loopback."""
    key = os.environ.get(env_name, "").strip() or None
    if key is None and not is_loopback(base_url):
        raise ConfigError(
            f"judge {model} needs an API key: set the environment variable {env_name} "
            f"(or name another one with {named('judge.api_key_env')}); servers on localhost need "
            "none"
        )
    register_secret(key)
    return key
