"""Operation policy (SPEC §4.6): the quota and billing hook in front of every paid agent task.

The orchestrator asks the policy for an ``analysis.agent`` grant before it creates a new logical
agent task, inside the same transaction, with an idempotency key per logical task. The policy
answers a :class:`Grant` or a :class:`Denial`; it is told to commit the grant when the attempt
completes, to mark it unknown when the outcome cannot be proven, and to release it when the task
is cancelled before any attempt. A host plugs in its own billing by implementing
:class:`OperationPolicy` and passing it as ``Orchestrator(policy=…)``; the default policies keep
their ledger in ``operation_grants``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from typing import Protocol, runtime_checkable

from sqlalchemy.engine import Connection

from app.db.enums import GrantState
from app.orchestrator.store import grants as store

AGENT_OPERATION = "analysis.agent"

FORBIDDEN = "operation_forbidden"
LIMIT_EXCEEDED = "operation_limit_exceeded"
UNAVAILABLE = "operation_policy_unavailable"


@dataclass(frozen=True)
class Grant:
    """Permission to run one logical operation; ``id`` is stored on the task (tasks.grant_id)."""

    id: uuid.UUID
    state: str = GrantState.ACQUIRED


class Denial:
    """A policy said no: the stage and job become blocked with this error (never woken)."""

    def __init__(self, code: str, message: str, retry_at: datetime | None = None):
        self.error = {"code": code, "message": message}
        self.retry_at = retry_at

    @property
    def code(self) -> str:
        return self.error["code"]


@runtime_checkable
class OperationPolicy(Protocol):
    """What the orchestrator needs from a policy. Every method runs inside the caller's transaction."""

    def acquire(
        self, conn: Connection, scope_id: str, operation: str, idempotency_key: str, now: datetime
    ) -> Grant | Denial:
        """Grant the operation (idempotent per key) or deny it with a stable code."""
        ...

    def commit(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        """The operation happened (bill it). Called at most once per grant with effect."""
        ...

    def release(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        """The operation will never happen (the task was cancelled before any attempt)."""
        ...

    def mark_unknown(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        """The operation may or may not have happened (an interrupted paid call)."""
        ...


class AllowAllPolicy:
    """Grants everything; still records grants so usage is visible and keys stay idempotent."""

    def acquire(self, conn: Connection, scope_id: str, operation: str, idempotency_key: str,
                now: datetime) -> Grant | Denial:
        row = store.acquire_txn(conn, scope_id, operation, idempotency_key, now)
        return Grant(row["id"], row["state"])

    # Each is idempotent: not matched means the grant already left ``acquired`` (committed once by
    # the fenced completion, released or marked unknown before) — nothing to do.
    def commit(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        store.commit_grant_txn(conn, grant_id, now)

    def release(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        store.release_grant_txn(conn, grant_id, now)

    def mark_unknown(self, conn: Connection, grant_id: uuid.UUID, now: datetime) -> None:
        store.mark_grant_unknown_txn(conn, grant_id, now)


def next_utc_midnight(now: datetime) -> datetime:
    """The start of the next UTC day (when a daily quota resets)."""
    utc_day = now.astimezone(timezone.utc).date()
    return datetime.combine(utc_day + timedelta(days=1), time(0), tzinfo=timezone.utc)


class QuotaPolicy(AllowAllPolicy):
    """At most ``limit_per_day`` agent operations per scope per UTC day.

    Grants in acquired, committed or unknown count (a possibly-made call is never free); released
    ones do not. Re-acquiring an existing key is free, so lease recovery and retries of the same
    task never consume quota twice. Decisions for one scope are serialised by an advisory lock.
    """

    def __init__(self, limit_per_day: int, operations: tuple[str, ...] = (AGENT_OPERATION,)):
        if limit_per_day < 0:
            raise ValueError("limit_per_day must be >= 0")
        self.limit_per_day = limit_per_day
        self.operations = operations

    def acquire(self, conn: Connection, scope_id: str, operation: str, idempotency_key: str,
                now: datetime) -> Grant | Denial:
        if operation not in self.operations:
            return super().acquire(conn, scope_id, operation, idempotency_key, now)
        store.lock_usage_txn(conn, scope_id, operation)
        existing = store.grant_by_key_txn(conn, scope_id, operation, idempotency_key)
        if existing is not None and existing["state"] in store.COUNTED:
            return Grant(existing["id"], existing["state"])
        reset_at = next_utc_midnight(now)
        used = store.count_used_txn(conn, scope_id, operation, reset_at - timedelta(days=1), reset_at)
        if used >= self.limit_per_day:
            return Denial(
                LIMIT_EXCEEDED,
                f"scope {scope_id!r} used its {self.limit_per_day} {operation} operations for today (UTC)",
                retry_at=reset_at,
            )
        return super().acquire(conn, scope_id, operation, idempotency_key, now)


def policy_from_settings(settings) -> OperationPolicy:
    """The configured policy: MEMEFLOW_OPERATION_POLICY = allow-all | quota (MEMEFLOW_AGENT_DAILY_QUOTA)."""
    if settings.operation_policy == "allow-all":
        return AllowAllPolicy()
    if settings.operation_policy == "quota":
        return QuotaPolicy(settings.agent_daily_quota)
    raise ValueError(f"unknown operation policy {settings.operation_policy!r}; expected 'allow-all' or 'quota'")
