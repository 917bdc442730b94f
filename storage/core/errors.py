"""The one exception tree of ctxprec. Every message says what went wrong and what to do next.

    CtxprecError                      the root: everything ctxprec raises on purpose
    ├── UserError                     a problem the user can fix (one line, no traceback, exit 2)
    │   ├── ConfigError, InputError, OutputError
    │   │                                 └── StateDamagedError  a state file in OUTDIR is damaged
    │   ├── NothingToCompareError     compare: the two sides have no row to pair
    │   ├── JudgeRefusedRunError      the judge refused the whole run (exit 4)
    │   │   ├── JudgeUnreachableError     no call ever reached the judge within the budget
    │   │   └── JudgeNoVerdictError       reply after reply held no readable verdict
    │   └── BatchesPendingError       provider batches still running (exit 6)
    └── JudgeError                    one failed judge call: a row status, never NaN (exit 1)
        ├── JudgeRetryableError, JudgeFatalError, JudgeParseError
        └── ScoreFailedError          the per-row API: some items of the row were not judged

Each class carries the process exit code the CLI uses for it (`exit_code`).
"""

from __future__ import annotations

from ctxprec.storage.core.verdict import Verdict

__all__ = [
    "BatchesPendingError",
    "ConfigError",
    "CtxprecError",
    "InputError",
    "JudgeError",
    "JudgeFatalError",
    "JudgeNoVerdictError",
    "JudgeParseError",
    "JudgeRefusedRunError",
    "JudgeRetryableError",
    "JudgeUnreachableError",
    "NothingToCompareError",
    "OutputError",
    "ScoreFailedError",
    "StateDamagedError",
    "UserError",
    "first_meaningful",
]


class CtxprecError(Exception):
    """The root of every exception ctxprec raises on purpose."""

    exit_code = 3


class UserError(CtxprecError):
    """A problem the user can fix; shown as a one-line message, exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """Bad configuration: unknown provider, missing key, bad TOML, conflicting flags."""


class InputError(UserError):
    """Bad input data that can be seen before any judge call (missing file, column, type)."""


class JudgeRefusedRunError(UserError):
    """The judge refused the whole run (bad key, no access, unknown model, out of quota, a
    request it rejects and that ctxprec cannot adapt): no further call can succeed, so the run
    stops at once (exit code 4). Finished parts are kept; the same command resumes once fixed.
    `lead` is how the CLI introduces the message."""

    exit_code = 4
    lead = "the judge refused the run"


class JudgeUnreachableError(JudgeRefusedRunError):
    """No call of the run ever reached the judge (connection refused, no such host, no
    connection within the timeout) for the whole retry budget: the run stops (exit 4) instead of
    failing every row."""

    lead = "the judge cannot be reached"


class JudgeNoVerdictError(JudgeRefusedRunError):
    """Reply after reply held no readable verdict (`[judge] max_unreadable_replies` in a row):
    the judge answers in a way ctxprec cannot read, so the run stops (exit 4) before paying for
    every item's re-asks."""

    lead = "the judge gives no readable verdict"


class OutputError(UserError):
    """The output folder cannot be used (holds another run, not writable)."""


class StateDamagedError(OutputError):
    """One of ctxprec's state files in OUTDIR is damaged (not JSON, wrong types, too large):
    the message names it and the way out; nothing was changed."""


class NothingToCompareError(UserError):
    """`compare`: a side holds no scored rows, a side's filter matches none, or no row pairs
    up (exit 2; with `--fail-drop` the gate had nothing to judge: exit 7, or 0 with
    `--pass-empty`)."""


class BatchesPendingError(UserError):
    """Provider batches are still running after --batch-wait: exit code 6; the same command
    collects them later."""

    exit_code = 6


class JudgeError(CtxprecError):
    """A judge call failed. `cause` is a short machine-friendly tag used in summaries."""

    exit_code = 1
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


class ScoreFailedError(JudgeError):
    """Some items could not be judged; `verdicts` holds None where a verdict is missing."""

    cause = "failed"

    def __init__(self, message: str, verdicts: list[Verdict | None]):
        super().__init__(message)
        self.verdicts = verdicts


def first_meaningful(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception to show for an exception group out of a task group: a Ctrl-C first,
    then a user-facing error; else the group itself (a bug: the CLI reports it, exit 3)."""
    for kind in (KeyboardInterrupt, UserError):
        match, _ = group.split(kind)
        if match is not None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf
    return group
