"""Typed stage errors with stable codes; the orchestrator decides retries from the class."""

from __future__ import annotations


class StageError(Exception):
    """A stage provider failed."""

    code: str = "stage_error"

    def __init__(self, message: str | None = None, *, code: str | None = None) -> None:
        self.code = code or type(self).code
        self.message = message or _first_doc_line(type(self))
        super().__init__(self.message)

    def __reduce__(self):  # keep keyword-only arguments across pickling (e.g. Celery results)
        return (_rebuild, (type(self), self.__dict__.copy()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class RetryableError(StageError):
    """The stage failed transiently and may be retried."""

    code = "stage_retryable"

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        not_executed: bool = True,
        retry_after_s: float | None = None,
        exhausted_code: str | None = None,
    ) -> None:
        super().__init__(message, code=code)
        # True only when the call provably did not happen (safe to re-send a paid request).
        self.not_executed = not_executed
        self.retry_after_s = retry_after_s
        # The code to fail with once max_attempts are spent, when a condition that persists is its
        # own diagnosis (a stored file still missing); None: ``max_attempts_exceeded``.
        self.exhausted_code = exhausted_code


class PermanentError(StageError):
    """The stage failed in a way a retry cannot fix."""

    code = "stage_permanent"


class ProviderConfigMismatch(PermanentError):
    """This worker's provider differs from the configuration the job was planned with."""

    code = "provider_config_mismatch"


class OutcomeUnknownError(StageError):
    """The request may have reached the provider; its outcome cannot be proven either way."""

    code = "agent_outcome_unknown"


def _first_doc_line(cls: type) -> str:
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0]


def _rebuild(cls: type[StageError], state: dict) -> StageError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message"))
    err.__dict__.update(state)
    return err
