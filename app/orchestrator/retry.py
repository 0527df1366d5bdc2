"""Pure retry decision: given an error and the attempt number, what happens next."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.stages.errors import OutcomeUnknownError, RetryableError, StageError


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    available_at: datetime | None = None
    code: str = ""
    unknown: bool = False  # the external call may have happened: never retry automatically


def backoff_delay(attempt: int, base_s: float, max_s: float, rand: random.Random | None = None) -> float:
    """Exponential backoff with full jitter in [delay/2, delay]: attempt 1 → ~base, 2 → ~2·base …"""
    delay = min(max_s, base_s * (2 ** max(0, attempt - 1)))
    r = (rand or random).random()
    return delay / 2 + r * delay / 2


def decide_retry(
    error: StageError, *, attempt: int, max_attempts: int, now: datetime, base_s: float, max_s: float,
    rand: random.Random | None = None, paid_call: bool = False,
) -> RetryDecision:
    """Retryable errors back off until ``max_attempts`` (then fail ``max_attempts_exceeded``, or the
    error's ``exhausted_code``); permanent and unknown outcomes stop.

    For a paid external call (``paid_call``) only an error that proves the call did not happen
    (``RetryableError.not_executed``) is retried; any other transient error leaves the outcome
    unprovable, so it ends as unknown (SPEC §4.5: never silently repeat a paid call).
    """
    if isinstance(error, OutcomeUnknownError):
        return RetryDecision(retry=False, code=error.code, unknown=True)
    if not isinstance(error, RetryableError):
        return RetryDecision(retry=False, code=error.code)
    if paid_call and not error.not_executed:
        return RetryDecision(retry=False, code=error.code, unknown=True)
    if attempt >= max_attempts:  # getattr: an error unpickled from an older worker has no exhausted_code
        return RetryDecision(retry=False, code=getattr(error, "exhausted_code", None) or "max_attempts_exceeded")
    delay = backoff_delay(attempt, base_s, max_s, rand)
    # the provider said when to come back (HTTP 429/503 Retry-After): not sooner — a retry before it
    # would only spend an attempt on another refusal — and not later than RETRY_AFTER_MAX_S
    asked = getattr(error, "retry_after_s", None)  # getattr: an error unpickled from an older worker
    if isinstance(asked, int | float) and math.isfinite(asked) and asked > delay:
        delay = min(float(asked), RETRY_AFTER_MAX_S)
    return RetryDecision(retry=True, available_at=now + timedelta(seconds=delay), code=error.code)


#: The longest wait a provider's Retry-After can ask of a task before its next attempt.
RETRY_AFTER_MAX_S = 3600.0


@dataclass(frozen=True)
class DeliveryDecision:
    give_up: bool
    available_at: datetime | None = None


def decide_delivery_retry(
    attempt: int, *, max_attempts: int, now: datetime, base_s: float, max_s: float, rand: random.Random | None = None,
) -> DeliveryDecision:
    """A webhook delivery failed for the ``attempt``-th time: back off with jitter, or give the event
    up once ``max_attempts`` are spent (the subscription then moves on to its next event)."""
    if attempt >= max_attempts:
        return DeliveryDecision(give_up=True)
    return DeliveryDecision(give_up=False,
                            available_at=now + timedelta(seconds=backoff_delay(attempt, base_s, max_s, rand)))
