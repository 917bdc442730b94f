"""The one exception tree of ctxprec. Every message says what went wrong and what to do next.

`CtxprecError` subclasses are user-facing (the CLI prints them without a traceback, exit 2);
`JudgeError` subclasses describe a failed judge call (they become row statuses, never NaN).
"""

from __future__ import annotations

__all__ = [
    "BatchesPendingError",
    "ConfigError",
    "CtxprecError",
    "InputError",
    "JudgeError",
    "JudgeFatalError",
    "JudgeParseError",
    "JudgeRefusedRunError",
    "JudgeRetryableError",
    "OutputError",
]


class CtxprecError(Exception):
    """Base class: a problem the user can fix; shown as a one-line message, exit code 2."""


class ConfigError(CtxprecError):
    """Bad configuration: unknown provider, missing key, bad TOML, conflicting flags."""


class InputError(CtxprecError):
    """Bad input data that can be seen before any judge call (missing file, column, type)."""


class JudgeRefusedRunError(CtxprecError):
    """The judge refused the whole run (bad key, no access, unknown model, out of quota, a
    request it rejects and that ctxprec cannot adapt): no further call can succeed, so the run
    stops at once (exit code 4). Finished parts are kept; the same command resumes once fixed."""


class OutputError(CtxprecError):
    """The output folder cannot be used (holds another run, not writable)."""


class BatchesPendingError(CtxprecError):
    """Provider batches are still running after --batch-wait: exit code 6; the same command
    collects them later."""

    exit_code = 6


class JudgeError(Exception):
    """A judge call failed. `cause` is a short machine-friendly tag used in summaries."""

    cause: str = "judge_error"
    body: str = ""  # the provider's response body, when the error came from an HTTP reply

    def __init__(self, message: str, *, cause: str | None = None, status: int | None = None):
        super().__init__(message)
        if cause is not None:
            self.cause = cause
        self.status = status


class JudgeRetryableError(JudgeError):
    """Timeouts, dropped connections, 408/409/429/5xx: worth another try after a pause."""

    cause = "retryable"

    def __init__(
        self,
        message: str,
        *,
        cause: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(message, cause=cause, status=status)
        self.retry_after = retry_after


class JudgeFatalError(JudgeError):
    """400/401/403/404/422, exhausted quota: retrying cannot help."""

    cause = "fatal"


class JudgeParseError(JudgeError):
    """The reply could not be read as a verdict (after the one re-ask)."""

    cause = "unparseable"
