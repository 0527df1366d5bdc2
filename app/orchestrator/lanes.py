"""Lane concurrency and fairness (SPEC §4.10) for the agent lane.

Limits are DB-wide (``lane_slots``), so they hold however many worker processes run: a global
pool (resource key ``*``) of ``agent_lane_limit`` slots and, per resource key (provider:model),
``agent_resource_limit`` slots; 0 means unlimited. Every process uses the deployment's values — the
most conservative among the live agent workers' registered limits and its own
(``lane_limits.LaneLimitCache``) — never its own settings alone. A claim takes its slot(s) in the claim
transaction; completion, failure and abandon release them in theirs (fenced by generation).

Fairness is round-robin over scopes by ``lane_fairness.last_dispatch_seq``: a claim is refused
while another scope with a due task was served less recently (its hint is dropped), and every
admitted claim moves its scope to the back.

Every free slot ends with a hint for a claimable task, without waiting for the sweep (SPEC §2.7,
§4.10). Three paths hand out hints, each only to tasks without a live hint (a hint in the broker
claims its task; hinting it again would only cost an empty claim):
- a slot's release (completion, failure, abandon, delete): the fairest task per freed slot
  (``next_fair_hints_txn``), if some due task waits unhinted;
- an admitted claim that saw a due task waiting unhinted: the fairest task per slot still free
  (``top_up_txn``) — the refused task of a reordered pair of hints is hinted again here, once the
  fairer task it waited for is claimed;
- a refusal, after its hint was cleared (``hints_after_refusal``): the tasks that would be
  admitted now, one per free slot — first waiting out (within a short budget) the transactions in
  flight that read the cleared hint as live (a slot release, a claim of the fairer task), so none of them and the
  refusal both leave the slot to the other. The refused task itself is among them only when
  nothing fairer waits any more, so two refused tasks never hint each other in turn.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import OperationalError

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


def _pools(orch: Orchestrator, conn: Connection, resource_key: str) -> list[tuple[str, int]]:
    """(resource key, limit) of each slot pool a claim of ``resource_key`` takes a slot of, under
    the deployment's limits in force (the registry read on ``conn`` at most once per interval)."""
    limits = orch.lane_limits.limits_txn(conn, orch.settings)
    pools = []
    if limits.lane > 0:
        pools.append((GLOBAL_KEY, limits.lane))
    if limits.resource > 0:
        pools.append((resource_key, limits.resource))
    return pools


class Admission(NamedTuple):
    """A claim's admission: ``admitted`` (else refuse it), and ``unhinted``: a due task of the lane
    waited without a live hint as it was admitted (then ``top_up_txn`` looks for free slots)."""

    admitted: bool
    unhinted: bool = False


ADMITTED, REFUSED = Admission(True), Admission(False)


def acquire_slot_txn(orch: Orchestrator, conn: Connection, row: RowMapping) -> Admission:
    """In the claim transaction: admit the claim fairly and take its slots, or refuse it."""
    lane = row["lane"]
    if lane not in LIMITED_LANES:
        return ADMITTED
    pools = _pools(orch, conn, row["resource_key"])
    if not pools:
        return ADMITTED  # unlimited: nothing to share, so nothing to be fair about
    now = orch.now()
    expires = now + timedelta(seconds=orch.settings.lease_s)
    # a first execution (generation 1) holds no slot to take over: one statement admits it. Not the
    # attempt count: a run that died beside others is re-claimed uncharged (tasks.CLAIM) while its
    # slot row still names it at its old generation — it must take that slot over, not a second one
    if row["claim_generation"] == 1:
        for key, limit in pools:
            _ensure_slots_txn(orch, conn, lane, key, limit, now)
        admitted = slots.admit_first_txn(conn, lane, row["resource_key"], row["scope_id"], pools, row["id"],
                                         row["claim_generation"], expires, now)
        # not matched: refused (a fairer scope waits, or no free slot); nothing was written
        return Admission(True, bool(admitted.row["unhinted"])) if admitted.matched else REFUSED
    if slots.fairer_scope_waiting_txn(conn, lane, row["resource_key"], row["scope_id"], now):
        return REFUSED
    for key, limit in pools:
        # a later execution (a retry, or a re-claim after an expired lease) may still hold its
        # earlier one's slot; not matched: it holds none (released, or freed by the sweep) — take a free one
        if slots.take_over_txn(conn, lane, key, row["id"], row["claim_generation"], expires, now).matched:
            continue
        _ensure_slots_txn(orch, conn, lane, key, limit, now)
        if not slots.take_free_txn(conn, lane, key, limit, row["id"], row["claim_generation"], expires, now).matched:
            return REFUSED  # no free slot: refuse the claim
    slots.record_dispatch_txn(conn, lane, row["resource_key"], row["scope_id"])
    return Admission(True, slots.unhinted_waiting_txn(conn, lane, now))  # a re-claim or retry: the rare path


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
) -> tuple[list[RowMapping], bool]:
    """After ``row`` (the hinted agent task, or a member of its group) was admitted in this
    transaction: claim up to ``n`` more due tasks of wake-up group ``group`` — one scope and
    resource key by construction, so the admission's fairness decision and the slot pools cover
    them — as far as free slots allow, each taking its slot(s). ``shared``: as ``tasks.claim_txn``.

    Free slots are locked first (SKIP LOCKED), so every task claimed here is sure of its slot.
    Group members left unclaimed lost their hint with this one: they wait unhinted, and the next
    freed slot hints them. Returns the rows claimed, and whether members were left so (after the
    commit, ``hints_after_refusal`` settles a slot whose release was in flight meanwhile).
    """
    lane = row["lane"]
    now = orch.now()
    expires = now + timedelta(seconds=orch.settings.lease_s)
    free = {key: slots.lock_free_txn(conn, lane, key, limit, n, now) for key, limit in _pools(orch, conn, row["resource_key"])}
    k = min([n, *(len(v) for v in free.values())])
    claimed = (tasks.claim_group_members_txn(conn, group, lane, k, owner, now, orch.settings.lease_s, shared)
               if k > 0 else None)
    # not matched (or no slot free): no member is due — all taken already, or the group is drained
    rows = list(claimed.rows) if claimed is not None and claimed.matched else []
    if rows:
        for key, slot_nos in free.items():
            slots.assign_txn(conn, lane, key, slot_nos[: len(rows)], rows, expires, now).expect(
                "its slots were locked free by lock_free_txn in this transaction")
    # members left over — slots ran out, or a member was not claimable now (locked, not due): the
    # group's one hint is spent, so they wait unhinted, and the caller hints free slots after commit
    left = len(rows) < n and tasks.clear_hint_txn(conn, group) > 0
    return rows, left


def extend_slot_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> None:
    """With a heartbeat: extend the lease of the claim's slots."""
    if claim.lane in LIMITED_LANES:
        now = orch.now()
        extended = slots.extend_txn(
            conn, claim.task_id, claim.generation, now + timedelta(seconds=orch.settings.lease_s), now)
        if not extended.matched and _pools(orch, conn, GLOBAL_KEY):
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
    return _hint_txn(conn, slots.fairest_queued_txn(conn, lane, now, freed), now)


def _hint_txn(conn: Connection, rows: list[RowMapping], now) -> list[Hint]:
    """Hint those of ``rows`` (fairest first) that have no live hint; in their order."""
    hinted = tasks.hint_unhinted_txn(conn, [r["id"] for r in rows], now)
    # not matched: each already has a live hint (it claims its task), or is being claimed right now
    ids = set(hinted.rows) if hinted.matched else set()
    return [Hint(r["lane"], r["id"]) for r in rows if r["id"] in ids]


def top_up_txn(orch: Orchestrator, conn: Connection, lane: str, resource_key: str) -> list[Hint]:
    """In an admitted claim's transaction, when a due task waited unhinted as it was admitted
    (``Admission.unhinted``): one slot per free slot left goes to the fairest waiting task — those
    without a live hint are hinted (published after the claim commits). This hints a task refused
    while a fairer one waited (two hints taken in the other order), once that fairer one is claimed."""
    if lane not in LIMITED_LANES:
        return []
    pools = _pools(orch, conn, resource_key)
    if not pools:
        return []
    now = orch.now()
    free = slots.free_count_txn(conn, lane, pools, now)
    return _hint_txn(conn, slots.fairest_queued_txn(conn, lane, now, free), now) if free > 0 else []


def refused_txn(orch: Orchestrator, conn: Connection, task_id) -> None:
    """A claim was refused (no free slot, or a fairer scope waits): its hint is spent, so the task
    now waits unhinted — ``hints_after_refusal`` (after this commits) hints whatever a free slot
    should take."""
    tasks.clear_hint_txn(conn, task_id)


#: At most this many transactions in flight are waited out after a refusal (each for one row).
SETTLE_WAITS = 8
#: All of those waits together take at most this long (each under a lock_timeout of what is left): a
#: slot release or claim in flight commits in milliseconds, while a long transaction holding a
#: candidate row (a batch seeding page) would otherwise stall the refused claim's worker thread for
#: the engine's lock_timeout per wait. Past it the step decides without the rest — best effort: a
#: slot left unhinted so is hinted by the next release, claim or refusal, else by the sweep.
SETTLE_BUDGET_S = 1.0


def hints_after_refusal(orch: Orchestrator, lane: str, resource_key: str) -> list[Hint]:
    """After a refusal's cleared hint committed (``refused_txn``): hint the tasks a free slot would
    admit now, one per free slot — the tasks of the fairest waiting scope(s) (a task of a scope
    that a fairer one still waits ahead of would be refused again), without a live hint. Returns
    the hints to publish (each transaction here commits before it returns).

    A slot release or a claim in flight may have read the cleared hint as live (a write skew: each
    leaves the slot to the other). So first the transactions that hold a held slot row or a
    candidate task row locked are waited out, one row at a time in a transaction of its own that
    holds nothing else (no lock cycle); a transaction that starts after the clear committed sees
    it, and hints the task itself (its release path, or its ``top_up_txn``). The waits share one
    short budget (``SETTLE_BUDGET_S``): a transaction outlasting it is not waited for further."""
    if lane not in LIMITED_LANES:
        return []
    with orch.engine.begin() as conn:
        pools = _pools(orch, conn, resource_key)
        if not pools:
            return []
        keys = [k for k, _ in pools]
        busy = slots.locked_held_txn(conn, lane, keys)
        now = orch.now()
        free = slots.free_count_txn(conn, lane, pools, now)
        candidates = _admissible(slots.fairest_queued_txn(conn, lane, now, free)) if free > 0 else []
        busy_tasks = tasks.locked_tasks_txn(conn, [r["id"] for r in candidates])
    if not busy and free < 1:
        return []  # every slot is held by a finished transaction: the next release hints
    waits = [functools.partial(slots.wait_slot_txn, lane=lane, resource_key=k, slot_no=n) for k, n in busy]
    waits += [functools.partial(tasks.wait_task_txn, task_id=t) for t in busy_tasks]
    deadline = time.monotonic() + SETTLE_BUDGET_S
    for wait in waits[:SETTLE_WAITS]:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms < 1:  # the budget is spent: decide without the rest
            break
        try:
            with orch.engine.begin() as conn:
                slots.bound_lock_waits_txn(conn, left_ms)
                wait(conn)
        except OperationalError as exc:
            # lock_timeout, the budget spent: a long transaction; decide without it — and without the
            # rest (the hint is best effort: the next event or the sweep repairs)
            log.warning("refusal: a transaction in flight outlasted the settle budget",
                        extra={"lane": lane, "code": str(exc.orig)[:80]})
            break
    with orch.engine.begin() as conn:
        now = orch.now()
        free = slots.free_count_txn(conn, lane, pools, now)
        return _hint_txn(conn, _admissible(slots.fairest_queued_txn(conn, lane, now, free)), now) if free > 0 else []


def _admissible(rows: list[RowMapping]) -> list[RowMapping]:
    """Of the fairest rows, those a claim would admit now: of each resource key, the scope(s) served
    least recently (``fairer_scope_waiting_txn``: no other waiting scope has a smaller seq)."""
    least: dict[str, int] = {}
    for r in rows:
        least[r["resource_key"]] = min(least.get(r["resource_key"], r["seq"]), r["seq"])
    return [r for r in rows if r["seq"] == least[r["resource_key"]]]


def release_orphan_slots_txn(orch: Orchestrator, conn: Connection) -> int:
    """The sweep: free slots whose holder ended, was re-claimed or let its lease expire; how many."""
    freed = slots.release_orphans_txn(conn, orch.now())
    return len(freed.rows) if freed.matched else 0  # not matched: no orphan
