"""Where the orchestrator meets the operation policy (SPEC §4.6): one grant per logical agent task.

The idempotency key of a logical agent task is (agent input fingerprint, job id): lease recovery
and automatic retries keep the same task and so its grant (tasks.grant_id); an explicit retry is a
new job revision, hence a new key and a fresh acquire.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import Stage
from app.orchestrator import fingerprints as fp
from app.orchestrator.policy import AGENT_OPERATION, AllowAllPolicy, Denial, Grant
from app.orchestrator.store import grants as store
from app.orchestrator.types import Claim

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator


def idempotency_key(job: RowMapping, fingerprint: str) -> str:
    return f"{fingerprint}:{job['id']}"


def agent_grants_txn(
    orch: Orchestrator, conn: Connection, items: list[tuple[RowMapping, str]]
) -> list[uuid.UUID | Denial | None]:
    """Acquire the grants of new logical agent tasks, one answer per (job, agent fingerprint): a
    grant id; None when the task insert will reuse a live task (which already holds its grant);
    or a Denial (the job is blocked). One statement each for the dedupe check and — with the
    built-in allow-all policy — the grants; a custom or quota policy decides per task."""
    if not items:
        return []
    now = orch.now()
    keys = [(job["scope_id"], fp.dedupe_key(job["image_id"], Stage.AGENT, f)) for job, f in items]
    live = store.active_dedupe_keys_txn(conn, keys)
    todo = [i for i, key in enumerate(keys) if key not in live]
    answers: list[uuid.UUID | Denial | None] = [None] * len(items)
    if type(orch.policy).acquire is AllowAllPolicy.acquire:
        wanted = [(items[i][0]["scope_id"], AGENT_OPERATION, idempotency_key(*items[i])) for i in todo]
        acquired = store.acquire_many_txn(conn, wanted, now)
        # not matched: nothing wanted — every agent task of these jobs reuses a live one
        for i, grant in zip(todo, acquired.rows if acquired.matched else (), strict=True):
            answers[i] = grant["id"]
        return answers
    # one scope after the other, in scope order: a policy may lock per scope (QuotaPolicy does, to
    # the end of the transaction), and completions whose batches mix scopes (the fair fill) would
    # otherwise take those locks in opposite orders and deadlock
    for i in sorted(todo, key=lambda i: items[i][0]["scope_id"]):
        job, fingerprint = items[i]
        answer = orch.policy.acquire(conn, job["scope_id"], AGENT_OPERATION, idempotency_key(job, fingerprint), now)
        assert isinstance(answer, (Grant, Denial)), f"policy returned {answer!r}"
        answers[i] = answer if isinstance(answer, Denial) else answer.id
    return answers


def bind_grant_txn(orch: Orchestrator, conn: Connection, grant_id: uuid.UUID | None, task_id: uuid.UUID) -> None:
    """Bind a taken grant to the task it pays for (when the task insert could not do it itself)."""
    if grant_id is not None:
        store.bind_task_txn(conn, grant_id, task_id, orch.now()).expect(
            "the task was inserted in this transaction")


def commit_grants_txn(orch: Orchestrator, conn: Connection, claims: list[Claim]) -> None:
    """In the fenced completion transaction: each paid operation happened exactly once. One
    statement with the built-in policies (their commit is a conditional state change); a custom
    policy's own ``commit`` per grant otherwise."""
    ids = grant_ids_txn(conn, claims)
    if builtin_commit(orch):
        store.commit_grants_txn(conn, ids, orch.now())  # not matched: no grant (or all committed): nothing to do
    else:
        for grant_id in ids:
            orch.policy.commit(conn, grant_id, orch.now())


def grant_ids_txn(conn: Connection, claims: list[Claim]) -> list[uuid.UUID]:
    """The grants the claims' tasks hold (read for a claim that does not carry its own)."""
    return [g for g in (c.grant_id or store.task_grant_txn(conn, c.task_id) for c in claims) if g is not None]


def builtin_commit(orch: Orchestrator) -> bool:
    """Is the policy's ``commit`` the built-in one (a conditional state change, set-based)?"""
    return type(orch.policy).commit is AllowAllPolicy.commit


def mark_grant_unknown_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    grant_id = store.task_grant_txn(conn, claim.task_id)
    mark = getattr(orch.policy, "mark_unknown", None)
    if grant_id is not None and mark is not None:
        mark(conn, grant_id, orch.now())


def release_uncalled_txn(orch: Orchestrator, conn: Connection, task_id: uuid.UUID) -> None:
    """A task ended by a check that precedes every call of its attempts (a configuration
    mismatch; its earlier attempts, if any, were retried only because they provably did not call
    out): give its grant back."""
    grant_id = store.task_grant_txn(conn, task_id)
    if grant_id is not None:
        orch.policy.release(conn, grant_id, orch.now())


def release_if_unattempted_txn(orch: Orchestrator, conn: Connection, task_id: uuid.UUID) -> None:
    """A task cancelled before any attempt never called out: give its grant back."""
    grant_id = store.task_grant_txn(conn, task_id)
    if grant_id is not None and not store.task_has_attempts_txn(conn, task_id):
        orch.policy.release(conn, grant_id, orch.now())
