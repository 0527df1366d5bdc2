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
from app.orchestrator.policy import AGENT_OPERATION, Denial, Grant
from app.orchestrator.store import grants as store
from app.orchestrator.types import Claim

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

_PENDING = "memeflow_pending_grants"  # conn.info key: grants acquired in this transaction, not yet bound


def idempotency_key(job: RowMapping, fingerprint: str) -> str:
    return f"{fingerprint}:{job['id']}"


def before_agent_task_txn(orch: Orchestrator, conn: Connection, job: RowMapping, fingerprint: str) -> Denial | None:
    """Acquire a grant for a new logical agent task; None = go ahead (granted, or deduplicated)."""
    if store.active_task_exists_txn(conn, job["scope_id"], fp.dedupe_key(job["image_id"], Stage.AGENT, fingerprint)):
        return None  # the insert will reuse a live task, which already holds its grant
    answer = orch.policy.acquire(conn, job["scope_id"], AGENT_OPERATION, idempotency_key(job, fingerprint), orch.now())
    if isinstance(answer, Denial):
        return answer
    assert isinstance(answer, Grant), f"policy returned {answer!r}"
    conn.info.setdefault(_PENDING, {})[(job["id"], fingerprint)] = answer.id
    return None


def pending_grant_txn(conn: Connection, job: RowMapping, fingerprint: str) -> uuid.UUID | None:
    """The grant acquired for (job, fingerprint) in this transaction and not yet bound, taken."""
    return conn.info.get(_PENDING, {}).pop((job["id"], fingerprint), None)


def bind_grant_txn(orch: Orchestrator, conn: Connection, grant_id: uuid.UUID | None, task_id: uuid.UUID) -> None:
    """Bind a taken grant to the task it pays for (when the task insert could not do it itself)."""
    if grant_id is not None:
        store.bind_task_txn(conn, grant_id, task_id, orch.now())


def commit_grant_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    """In the fenced completion transaction: the paid operation happened exactly once."""
    grant_id = claim.grant_id or store.task_grant_txn(conn, claim.task_id)
    if grant_id is not None:
        orch.policy.commit(conn, grant_id, orch.now())


def mark_grant_unknown_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    grant_id = store.task_grant_txn(conn, claim.task_id)
    mark = getattr(orch.policy, "mark_unknown", None)
    if grant_id is not None and mark is not None:
        mark(conn, grant_id, orch.now())


def release_if_unattempted_txn(orch: Orchestrator, conn: Connection, task_id: uuid.UUID) -> None:
    """A task cancelled before any attempt never called out: give its grant back."""
    grant_id = store.task_grant_txn(conn, task_id)
    if grant_id is not None and not store.task_has_attempts_txn(conn, task_id):
        orch.policy.release(conn, grant_id, orch.now())
