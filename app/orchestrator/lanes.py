"""Lane concurrency and fairness (SPEC §4.10) for the agent lane.

Limits are DB-wide (``lane_slots``), so they hold however many worker processes run: a global
pool (resource key ``*``) of ``agent_lane_limit`` slots and, per resource key (provider:model),
``agent_resource_limit`` slots; 0 means unlimited. A claim takes its slot(s) in the claim
transaction; completion, failure and abandon release them in theirs (fenced by generation).

Fairness is round-robin over scopes by ``lane_fairness.last_dispatch_seq``: a claim is refused
while another scope with a due task was served less recently (its hint is dropped; the slot-free
path and the sweep hint the fairest task), and every admitted claim moves its scope to the back.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.hints import Hint
from app.orchestrator.stages import SLOT_LANES, by_lane
from app.orchestrator.store import slots, tasks
from app.orchestrator.types import Claim

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

GLOBAL_KEY = "*"
_SLOTS_READY: set[tuple[str, str, str, int]] = set()
LIMITED_LANES = SLOT_LANES  # the agent lane


def _pools(orch: Orchestrator, resource_key: str) -> list[tuple[str, int]]:
    s = orch.settings
    pools = []
    if s.agent_slots > 0:
        pools.append((GLOBAL_KEY, s.agent_slots))
    if s.agent_resource_limit > 0:
        pools.append((resource_key, s.agent_resource_limit))
    return pools


def acquire_slot_txn(orch: Orchestrator, conn: Connection, row: RowMapping) -> bool:
    """In the claim transaction: admit the claim fairly and take its slots; False = refuse it."""
    lane = row["lane"]
    if lane not in LIMITED_LANES:
        return True
    pools = _pools(orch, row["resource_key"])
    if not pools:
        return True  # unlimited: nothing to share, so nothing to be fair about
    now = orch.now()
    expires = now + timedelta(seconds=orch.settings.lease_s)
    if row["attempt_count"] == 1:  # a first claim holds no slot to take over: one statement admits it
        for key, limit in pools:
            _ensure_slots_txn(orch, conn, lane, key, limit, now)
        return slots.admit_first_txn(conn, lane, row["resource_key"], row["scope_id"], pools, row["id"],
                                     row["claim_generation"], expires, now).matched
    if slots.fairer_scope_waiting_txn(conn, lane, row["resource_key"], row["scope_id"], now):
        return False
    for key, limit in pools:
        # only a re-claim (an earlier execution's lease expired) can still hold a slot; not matched:
        # it holds none (or this is a first claim) — take a free one
        if row["attempt_count"] > 1 and slots.take_over_txn(
            conn, lane, key, row["id"], row["claim_generation"], expires, now
        ).matched:
            continue
        _ensure_slots_txn(orch, conn, lane, key, limit, now)
        if not slots.take_free_txn(conn, lane, key, limit, row["id"], row["claim_generation"], expires, now).matched:
            return False  # no free slot: refuse the claim
    slots.record_dispatch_txn(conn, lane, row["resource_key"], row["scope_id"])
    return True


def _ensure_slots_txn(orch: Orchestrator, conn: Connection, lane: str, key: str, limit: int, now) -> None:
    """The pool's slot rows exist (created in this transaction if missing)."""
    marker = (str(orch.engine.url), lane, key, limit)
    # slot rows are never deleted: once seen committed (ensure not matched: nothing to create),
    # skip the check in this process; rows created now are not committed yet
    if marker not in _SLOTS_READY and not slots.ensure_slots_txn(conn, lane, key, limit, now).matched:
        _SLOTS_READY.add(marker)


def lane_batch_size(settings, lane: str) -> int:
    """How many due tasks one hint of ``lane`` may claim, and so how many tasks one hint wakes.

    The agent lane's batch (``Settings.agent_batch``: 1 for a local agent, whose worker runs a
    call per core in threads) never exceeds its lane limit (a batch holds one slot per task)."""
    spec = by_lane(lane)
    if spec is None:
        return 1
    size = getattr(settings, spec.batch_size_setting)
    if spec.slots:
        limits = [n for n in (settings.agent_slots, settings.agent_resource_limit) if n > 0]
        return max(1, min([size, *limits]))
    return size


def lane_batch_budget(settings, lane: str) -> int:
    """How much one batch of a batched lane may hold, in the unit of its stage's ``batch_cost_sql``: decoded
    pixels (visual) or document characters (embedding). A batch always takes at least one task."""
    spec = by_lane(lane)
    if spec is None or spec.batch_budget_setting is None:
        raise KeyError(str(lane))
    return getattr(settings, spec.batch_budget_setting)


def wake_group_size(settings, lane: str) -> int:
    """How many tasks one wake-up group (one hint) of ``lane`` may hold.

    The batched lanes keep ``n // 8`` (at least one) of each claim's ``n`` for the fair fill
    (``tasks.claim_batch_txn``): a hint claims its whole group and fills the rest round-robin over
    the least recently served scopes, so another scope's waiting task is never more than
    ceil(waiting scopes / reserve) claims away, however many of one scope's hints are ahead of it
    in the broker. A batch size of 1 leaves no room: such a lane is served in hint order."""
    n = lane_batch_size(settings, lane)
    spec = by_lane(lane)
    if spec is not None and spec.batched and n > 1:
        return n - max(1, n // 8)
    return n


def claim_group_txn(
    orch: Orchestrator, conn: Connection, group: uuid.UUID, row: RowMapping, n: int, owner: str, shared: bool = False,
) -> list[RowMapping]:
    """After ``row`` (the hinted agent task, or a member of its group) was admitted in this
    transaction: claim up to ``n`` more due tasks of wake-up group ``group`` — one scope and
    resource key by construction, so the admission's fairness decision and the slot pools cover
    them — as far as free slots allow, each taking its slot(s). ``shared``: as ``tasks.claim_txn``.

    Free slots are locked first (SKIP LOCKED), so every task claimed here is sure of its slot.
    Group members left unclaimed lost their hint with this one: they wait unhinted, and the next
    freed slot (or the sweep) hints them.
    """
    lane = row["lane"]
    now = orch.now()
    expires = now + timedelta(seconds=orch.settings.lease_s)
    free = {key: slots.lock_free_txn(conn, lane, key, limit, n, now) for key, limit in _pools(orch, row["resource_key"])}
    k = min([n, *(len(v) for v in free.values())])
    claimed = (tasks.claim_group_members_txn(conn, group, lane, k, owner, now, orch.settings.lease_s, shared)
               if k > 0 else None)
    # not matched (or no slot free): no member is due — all taken already, or the group is drained
    rows = list(claimed.rows) if claimed is not None and claimed.matched else []
    if rows:
        for key, slot_nos in free.items():
            slots.assign_txn(conn, lane, key, slot_nos[: len(rows)], rows, expires, now).expect(
                "its slots were locked free by lock_free_txn in this transaction")
    if len(rows) == k < n:  # slots ran out before the group did
        tasks.clear_hint_txn(conn, group)  # the members left over (the claimed ones are running)
    return rows


def extend_slot_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    """With a heartbeat: extend the lease of the claim's slots."""
    if claim.lane in LIMITED_LANES:
        now = orch.now()
        extended = slots.extend_txn(
            conn, claim.task_id, claim.generation, now + timedelta(seconds=orch.settings.lease_s), now)
        if not extended.matched and _pools(orch, GLOBAL_KEY):
            # the slot's lease ran out before this heartbeat, and the sweep freed it or another claim
            # took it: the task runs on (its own fenced heartbeat decides that) outside the lane limit
            log.warning("lane slot lost", extra={"task_id": str(claim.task_id), "lane": claim.lane,
                                                 "generation": claim.generation})


def release_slot_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    """With the claim's end: free its slots (not matched: it held none — unlimited, or freed already)."""
    if claim.lane in LIMITED_LANES:
        slots.release_txn(conn, claim.task_id, claim.generation, orch.now())


def release_slots_txn(orch: Orchestrator, conn: Connection, claims: list[Claim]) -> None:
    """``release_slot_txn`` for several claims, one statement (not matched: none held a slot)."""
    slots.release_many_txn(conn, slot_holders(claims), orch.now())


def slot_holders(claims: list[Claim]) -> list[tuple[uuid.UUID, int]]:
    """(task id, generation) of the claims that may hold slots (their lane is limited)."""
    return [(c.task_id, c.generation) for c in claims if c.lane in LIMITED_LANES]


def next_fair_hints_txn(orch: Orchestrator, conn: Connection, claim: Claim, freed: int = 1) -> list[Hint]:
    """``freed`` slots just freed: hint the fairest queued due tasks of the lane (marked hinted).

    Only while some due task of the lane waits without a live hint (a refused claim clears its
    task's ``last_hint_at``, as does a retry's requeue): a task whose hint is still in the broker
    will be claimed by it, and hinting it again would only cost an empty claim.
    """
    return next_fair_hints_of_lane_txn(orch, conn, claim.lane, freed)


def next_fair_hints_of_lane_txn(orch: Orchestrator, conn: Connection, lane: str, freed: int) -> list[Hint]:
    """``next_fair_hints_txn`` for ``freed`` slots of ``lane`` freed by something other than a claim's
    end (an image deleted while its task held one: the row's cascade frees it)."""
    if lane not in LIMITED_LANES or freed < 1:
        return []
    now = orch.now()
    if not slots.unhinted_waiting_txn(conn, lane, now):
        return []
    rows = slots.fairest_queued_txn(conn, lane, now, freed)
    if not rows:
        return []
    tasks.mark_hinted_txn(conn, [r["id"] for r in rows], now)
    return [Hint(r["lane"], r["id"]) for r in rows]


def refused_txn(orch: Orchestrator, conn: Connection, task_id) -> None:
    """A claim was refused (no free slot, or a fairer scope waits): its hint is spent, so the task
    now waits unhinted — the next released slot (or the sweep) hints the fairest such task."""
    tasks.clear_hint_txn(conn, task_id)


def release_orphan_slots_txn(orch: Orchestrator, conn: Connection) -> int:
    """The sweep: free slots whose holder ended, was re-claimed or let its lease expire; how many."""
    freed = slots.release_orphans_txn(conn, orch.now())
    return len(freed.rows) if freed.matched else 0  # not matched: no orphan
