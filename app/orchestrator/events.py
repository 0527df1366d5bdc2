"""Reading the events outbox (issue 20): pages for the long-poll, SSE and webhook deliveries,
stream slots (bounded live streams per scope), ``batch.progress`` and retention (sweep steps).

Ordering guarantee: ids of one scope are drawn at commit time under the scope's advisory lock
(migration 0014), so "every event of the scope with id > N" is a stable question — an event that
commits later always has a larger id than every event of its scope visible now. A cursor
(``after``) therefore never skips an event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import RowMapping

from app.db.enums import ACTIVE_JOB_STATUSES, BatchStatus, EventType
from app.orchestrator.errors import TooManyStreams
from app.orchestrator.store import batches as batches_q
from app.orchestrator.store import events as q

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

PRUNE_LIMIT = 5000


def event_doc(row: RowMapping) -> dict[str, Any]:
    """The API shape of one event (also the webhook body)."""
    return {
        "id": int(row["id"]), "type": row["type"], "scope_id": row["scope_id"],
        "job_id": str(row["job_id"]) if row["job_id"] else None,
        "image_id": str(row["image_id"]) if row["image_id"] else None,
        "batch_id": str(row["batch_id"]) if row["batch_id"] else None,
        "payload": row["payload"] or {}, "created_at": row["created_at"].isoformat(),
    }


def read_events(orch: Orchestrator, scope_id: str, after: int, limit: int, *, with_mark: bool = True
                ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The scope's events with id > ``after``, oldest first, at most ``limit``; and what the read
    may have missed to retention (``expired``), or None.

    ``expired`` when the prune has deleted ids of the scope above ``after``: events with ids in
    (after, through] may be gone. The mark is read after the page, so a prune that commits between
    the two is told (it may then warn about events the page did return: "may", never a silent
    loss). A cursor of 0 means "from the oldest kept": it has missed nothing. ``with_mark=False``:
    the page only (a stream reads the mark less often than it polls)."""
    with orch.engine.connect() as conn:
        rows = q.events_after_txn(conn, scope_id, after, limit)
        through = q.pruned_through_txn(conn, scope_id) if after > 0 and with_mark else 0
    expired = None
    if through > after:
        expired = {
            "code": "events_expired", "after": after, "through": through,
            "message": f"events of this scope with ids up to {through} were deleted (MEMEFLOW_EVENTS_RETENTION_S);"
                       f" some after {after} may be missing: re-read the jobs, images and batches you follow",
        }
    return [event_doc(r) for r in rows], expired


def last_event_id(orch: Orchestrator, scope_id: str) -> int:
    with orch.engine.connect() as conn:
        return q.last_event_id_txn(conn, scope_id)


class StreamSlot:
    """One of a scope's ``event_streams_per_scope`` live-stream slots, held under a lease."""

    def __init__(self, orch: Orchestrator, scope_id: str, slot_no: int, holder: str) -> None:
        self.orch, self.scope_id, self.slot_no, self.holder = orch, scope_id, slot_no, holder

    def renew(self) -> bool:
        """Extend the lease; False when it lapsed and another stream took the slot (stop then)."""
        s = self.orch.settings
        with self.orch.engine.begin() as conn:
            renewed = q.renew_stream_slot_txn(conn, self.scope_id, self.slot_no, self.holder, self.orch.now(),
                                              stream_lease_s(s))
        return renewed.matched  # not matched: the lease lapsed and the slot is another stream's

    def release(self) -> None:
        """Free the slot (not matched: its lease had lapsed — it is free or another stream's already)."""
        with self.orch.engine.begin() as conn:
            q.release_stream_slot_txn(conn, self.scope_id, self.slot_no, self.holder)


def stream_lease_s(settings: Any) -> float:
    """A slot's lease: long enough for a few renewals (every heartbeat) to be missed."""
    return max(3 * float(settings.event_heartbeat_s), 3 * float(settings.event_poll_s), 5.0)


@contextmanager
def stream_slot(orch: Orchestrator, scope_id: str) -> Iterator[StreamSlot]:
    """Hold a stream slot of ``scope_id`` for the block; ``TooManyStreams`` when all are held."""
    s = orch.settings
    holder = uuid.uuid4().hex
    with orch.engine.begin() as conn:
        from app.orchestrator.store.images import ensure_scope_txn

        ensure_scope_txn(conn, scope_id)
        # one open of the scope at a time (a lock held to this commit): racing opens each looked at
        # the same free slot, and a few rounds of losing answered 429 while slots were free
        q.lock_stream_slots_txn(conn, scope_id)
        acquired = q.acquire_stream_slot_txn(conn, scope_id, holder, s.event_streams_per_scope, orch.now(),
                                             stream_lease_s(s))
        slot_no = acquired.row if acquired.matched else None  # not matched: every slot is held
    if slot_no is None:
        raise TooManyStreams(f"at most {s.event_streams_per_scope} live event streams per scope")
    slot = StreamSlot(orch, scope_id, slot_no, holder)
    try:
        yield slot
    finally:
        slot.release()


def emit_batch_progress(orch: Orchestrator, batch_id: uuid.UUID, *, cancelled: bool = False) -> bool:
    """Sweep step: a ``batch.progress`` event with the unfinished (seeding or running) batch's
    counts, if they changed since its last one (one per batch per sweep at most). True when an
    event was staged.

    ``cancelled``: a cancelled batch whose progress is still open instead — the batch.cancelled
    event counted the batch's jobs as they were when it was marked, still active; its cancel, then
    the sweep, tell the counts again while they change (an item may follow a job the cancel left
    running: an upload's the batch adopted, or one another batch follows), and close its progress
    once they are final (no active item job), so its last event carries its final counts — also
    when a job ended between this read and this commit (the next sweep reads it)."""
    wanted = (BatchStatus.CANCELLED,) if cancelled else (BatchStatus.SEEDING, BatchStatus.RUNNING)
    with orch.engine.begin() as conn:
        batch = batches_q.batch_txn(conn, batch_id, lock=True)
        if batch is None or batch["status"] not in wanted or (cancelled and not batch["progress_open"]):
            return False
        counts = batches_q.item_counts_txn(conn, batch_id)
        if cancelled:  # final once no item job is active: a terminal job status never changes
            final = not any(status in ACTIVE_JOB_STATUSES for status in counts)
            batches_q.settle_cancelled_progress_txn(conn, batch_id, not final, orch.now()).expect(
                "the batch is locked with its progress open")
        last = q.last_batch_progress_txn(conn, batch_id)
        if last is not None and last.get("counts") == counts:
            return False
        terminal = sum(n for status, n in counts.items() if status not in ACTIVE_JOB_STATUSES)
        total = batch["total"]
        q.stage_event_txn(conn, batch["scope_id"], EventType.BATCH_PROGRESS.value, {
            "batch_id": str(batch_id), "status": batch["status"], "total": total, "counts": counts,
            "progress": min(1.0, round(terminal / total, 6)) if total else 0.0,  # as GET /batches/{id}
        }, batch_id=batch_id)
    return True


def prune_events(orch: Orchestrator) -> int:
    """Sweep step: delete events older than ``events_retention_s`` (bounded per run); webhook
    subscriptions that had not delivered them are told (``events_expired``), never skipped silently."""
    now = orch.now()
    cutoff = now - timedelta(seconds=orch.settings.events_retention_s)
    with orch.engine.begin() as conn:
        pruned = q.prune_events_txn(conn, cutoff, PRUNE_LIMIT, now)
    return pruned.affected if pruned.matched else 0  # not matched: nothing old enough
