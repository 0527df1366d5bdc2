"""Leaf tasks: create (deduplicated), claim, heartbeat and the fenced terminal transitions.

Every write after a claim is conditioned on (task id, lease_owner, claim_generation,
status = 'running'); zero rows means the caller was fenced out. Each transition is one named
statement below, written out whole (the claim's SET list and its "stages and job to running"
writes are repeated in each claim statement on purpose: the statement that runs is the one you
read). Status values are literal in the SQL: the partial indexes (``ix_tasks_dedupe_active`` …)
are only used, and ``ON CONFLICT`` only infers them, when the predicate is spelled in the text.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.jsoncodec import dumps
from app.ids import new_id
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.stages import BATCH_COST_CASE
from app.orchestrator.store._sql import Outcome, sql, transition

# What one task of a batched lane costs the worker that holds the batch in memory, read from its
# image row (each batched stage declares its ``batch_cost_sql`` in app/orchestrator/stages.py):
# decoded pixels (visual), or the characters its semantic document is rendered from (embedding). A
# batch claims a prefix of its candidates whose costs sum within the lane's budget
# (``lanes.lane_batch_budget``). The two batched claims (CLAIM_GROUP, CLAIM_FAIR_BATCH) take that
# CASE from the registry, once at import; their rendered SQL is docs/sql/claim_group.sql and
# docs/sql/claim_fair_batch.sql (tests/unit/test_stage_sql.py fails when they drift).
#
# A worker that dies (a decoder or model segfault, an OOM, a kill) leaves its claims running with a
# lapsing lease; only a run that held the task alone says the death was that task's own (SPEC §10:
# one item never charges another). So every claim records ``claimed_alone``, and the claim of a
# task whose lease lapsed (``status = 'running'``: its previous run died) takes it alone — never
# with its group or a fair fill, and no fill ever picks it (fills take queued tasks only) — and
# refunds the attempt of a run that died in a batch of several (``attempt_count`` + 0, claimable
# even at ``max_attempts``). A poisoned item thus dies alone next time and is charged for its own
# deaths only; the sweep ends it ``max_attempts_exceeded`` once they are spent (sweep.py).
#
# An agent task whose last attempt's run died alone with its attempt still external_started is
# claimable once more (attempt_count = max_attempts + 1 after it): a *recovery claim* that only
# looks the attempt up (SPEC §4.5) — a result recorded before the death is adopted, otherwise it
# ends (app/worker/run.py); never a new call. If that claim dies too, the count is past
# max_attempts, no claim matches, and the sweep ends the task (sweep._spent).

INSERT_TASK = sql("""
INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint, dedupe_key,
                   image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,
                   created_at, updated_at)
VALUES (:id, :scope_id, :job_id, :stage, :lane, :resource_key, CAST(:payload AS jsonb), :input_fingerprint,
        :dedupe_key, :image_id, :image_sha256, 'queued', :priority, :now, :max_attempts, :now, :now, :now)
ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING
RETURNING id, status
""")

ACTIVE_TASK_BY_DEDUPE_KEY = sql("""
SELECT id, status FROM tasks WHERE scope_id = :s AND dedupe_key = :k AND status IN ('queued', 'running')
""")


@transition
def insert_task_txn(conn: Connection, values: dict[str, Any], now: datetime) -> Outcome[tuple[uuid.UUID, str]]:
    """— → queued: create a task, unless an identical one (same dedupe key in the scope) is active.

    Matched: created, ``row`` = (id, 'queued'). Not matched: ``row`` = (id, status) of the active
    task to reuse. ``last_hint_at`` is set now: the caller publishes the hint right after commit,
    and the sweep re-hints if that publish is lost.
    """
    row = conn.execute(
        INSERT_TASK, {**values, "id": new_id(), "payload": canonical_json(values["payload"]), "now": now}
    ).first()
    if row is not None:
        return Outcome(True, ((row[0], row[1]),))
    existing = conn.execute(ACTIVE_TASK_BY_DEDUPE_KEY, {"s": values["scope_id"], "k": values["dedupe_key"]}).first()
    if existing is None:  # it finished between our insert and select: create a fresh one
        return insert_task_txn(conn, values, now)
    return Outcome(False, ((existing[0], existing[1]),))


CLAIM = sql("""
WITH c AS (
  UPDATE tasks SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1,
         attempt_count = attempt_count + CASE WHEN status = 'running' AND NOT claimed_alone THEN 0 ELSE 1 END,
         claimed_alone = NOT CAST(:shared AS boolean), started_at = coalesce(started_at, :now), updated_at = :now
  WHERE id = :id AND NOT cancel_requested
    AND (attempt_count < max_attempts OR (status = 'running' AND NOT claimed_alone)
         OR (status = 'running' AND attempt_count = max_attempts AND lane = 'agent' AND EXISTS (
               SELECT FROM task_attempts a WHERE a.task_id = tasks.id AND a.state = 'external_started')))
    AND (CAST(:lane AS text) IS NULL OR lane = :lane)
    AND ((status = 'queued' AND available_at <= :now) OR (status = 'running' AND lease_expires_at < :now))
  RETURNING id, scope_id, job_id, image_id, image_sha256, stage, lane, resource_key, claim_generation,
            attempt_count, max_attempts, payload, input_fingerprint, grant_id, hint_group
), s AS (
  UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,
         started_at = coalesce(js.started_at, :now), updated_at = :now
  FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')
), j AS (
  UPDATE processing_jobs pj SET status = 'running', updated_at = :now
  FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'
)
SELECT c.*, i.storage_key FROM c JOIN images i ON i.id = c.image_id
""")


@transition
def claim_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, now: datetime, lease_s: float, lane: str | None = None,
    shared: bool = False,
) -> Outcome[RowMapping]:
    """queued (due) or running (lease expired) → running, generation + 1: the one road into running.

    The same statement moves the task's waiting stage(s) and a queued job to running. A claim of
    one task is a run alone (``claimed_alone``) unless ``shared``: its process runs other claims
    beside it (a threads pool, an agent batch), so a death there is charged to none until
    ``run_alone_txn``; a lapsed run that was not alone is not charged (see above). Not matched: the
    hint was stale, a duplicate, or (with ``lane``) for another lane.
    """
    return Outcome.of(conn.execute(
        CLAIM, {"id": task_id, "owner": owner, "now": now, "exp": now + timedelta(seconds=lease_s), "lane": lane,
                "shared": shared}
    ).mappings().all())


CLAIM_GROUP = sql(f"""
WITH cand AS MATERIALIZED (
  SELECT t.id, t.id = :id AS hinted, t.status = 'running' AS died, t.priority, t.available_at,
         {BATCH_COST_CASE} AS cost
  FROM tasks t JOIN images i ON i.id = t.image_id
  WHERE (t.id = :id OR (t.hint_group = :id AND t.status = 'queued')) AND t.lane = :lane
    AND NOT t.cancel_requested AND (t.attempt_count < t.max_attempts OR (t.status = 'running' AND NOT t.claimed_alone))
    AND ((t.status = 'queued' AND t.available_at <= :now) OR (t.status = 'running' AND t.lease_expires_at < :now))
  FOR UPDATE OF t SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER w AS k, sum(cost) OVER w AS total FROM cand
  WINDOW w AS (ORDER BY hinted DESC, priority DESC, available_at, id)
), pick AS (
  SELECT id FROM ranked WHERE k = 1 OR (total <= :budget AND NOT EXISTS (SELECT FROM cand WHERE died))
), c AS (
  UPDATE tasks t SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1,
         attempt_count = t.attempt_count + CASE WHEN t.status = 'running' AND NOT t.claimed_alone THEN 0 ELSE 1 END,
         claimed_alone = (SELECT count(*) FROM pick) = 1 AND NOT CAST(:shared AS boolean),
         started_at = coalesce(started_at, :now), updated_at = :now
  FROM pick WHERE t.id = pick.id
  RETURNING t.id, t.scope_id, t.job_id, t.image_id, t.image_sha256, t.stage, t.lane, t.resource_key,
            t.claim_generation, t.attempt_count, t.max_attempts, t.payload, t.input_fingerprint, t.grant_id,
            t.hint_group
), s AS (
  UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,
         started_at = coalesce(js.started_at, :now), updated_at = :now
  FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')
), j AS (
  UPDATE processing_jobs pj SET status = 'running', updated_at = :now
  FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'
)
SELECT c.*, i.storage_key, cand.cost AS batch_cost, cand.died,
       (SELECT count(*) FROM cand) - (SELECT count(*) FROM pick) AS left_out
FROM c JOIN images i ON i.id = c.image_id JOIN cand ON cand.id = c.id
""")


@transition
def claim_group_txn(
    conn: Connection, task_id: uuid.UUID, lane: str, owner: str, now: datetime, lease_s: float, *, budget: int,
    shared: bool = False,
) -> tuple[Outcome[RowMapping], int]:
    """queued → running: a batched lane's hinted task and its wake-up group's due members, within the budget.

    The hinted task is claimable as in ``claim_txn``; members another claimer holds are skipped
    (SKIP LOCKED). The longest prefix — hinted task first, then priority, age — whose costs
    (BATCH_COST_CASE) sum within ``budget`` is claimed, and always at least one task (a huge image is
    never starved). A hinted task whose lease lapsed (its run died: ``died`` on its row) is
    claimed alone, and its queued members count as left out. Returns the outcome (not matched:
    neither the task nor any member was claimable) and how many due members were left out: they
    stay queued in the group, and a new hint naming ``task_id`` claims them (the hinted task is
    running by then). A group is otherwise claimed whole — it is at most its creator's batch
    size — so a claimer with a smaller ``n`` leaves no member behind with its hint spent. Call
    ``lock_hinted_txn`` first, in the same transaction.

    ``shared``: the claimer's process runs other claims side by side (a threads pool), so even a
    claim of one task is no run alone — a death there may be another thread's (``run_alone_txn``).
    """
    rows = conn.execute(CLAIM_GROUP, {"id": task_id, "lane": lane, "owner": owner, "now": now,
                                      "exp": now + timedelta(seconds=lease_s), "budget": budget,
                                      "shared": shared}).mappings().all()
    return Outcome.of(rows), (int(rows[0]["left_out"]) if rows else 0)


GENERIC_PLANS = sql("SELECT set_config('plan_cache_mode', 'force_generic_plan', true)")


def generic_plans_txn(conn: Connection) -> None:
    """The rest of this transaction runs its prepared statements on their generic plans.

    For the batched claims (CLAIM_GROUP, CLAIM_FAIR_BATCH, CLAIM_GROUP_MEMBERS): PostgreSQL
    estimates their generic plans (``LIMIT $n``, ``available_at <= $now`` unknown) dearer than a
    custom plan and so planned them on every call, ≈ 0.5–1.5 ms each — ≈ 8 % of the server's CPU
    in the no-op drain (docs/performance-log.md §26). Their generic plans are index nested loops on
    ids (CLAIM_FAIR_BATCH's ``h`` is materialized for that: the few picked ids, then ``tasks``
    by primary key — ``t.id = ANY(ARRAY(SELECT id FROM h))``, or the generic plan, blind to
    ``LIMIT :n``, hash-joined ``h`` with the lane's whole queue: docs/performance-log.md §46), as fast
    as the custom ones at any table size. ``SET LOCAL``: it ends with
    the transaction; the other statements of a claim's transaction are on generic plans already.
    """
    conn.execute(GENERIC_PLANS)


# Batched lanes' fairness (CLAIM_FAIR_BATCH): the scopes with due queued tasks in a lane (a loose
# index scan over ix_tasks_lane_scope_due, so its cost follows the number of waiting scopes, not
# the backlog), the :n least recently served of them (lane_fairness at resource key '*'; scopes in
# :served were just served by this transaction's group claim, so they go last), each scope's :n
# best due tasks ranked within the scope (rk), locked SKIP LOCKED in round-robin order — every
# scope's first task, then every scope's second … — then the prefix within the budget is claimed
# and the claimed scopes (and the group's) move to the back of the round: one upsert in scope
# order, so concurrent claimers queue on the same rows in the same order.
CLAIM_FAIR_BATCH = sql(f"""
WITH cand AS MATERIALIZED (
  WITH RECURSIVE w AS (
    (SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued' AND available_at <= :now
       AND NOT cancel_requested AND attempt_count < max_attempts ORDER BY scope_id LIMIT 1)
    UNION ALL
    SELECT x.scope_id FROM w, LATERAL (
      SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued' AND scope_id > w.scope_id
        AND available_at <= :now AND NOT cancel_requested AND attempt_count < max_attempts
      ORDER BY scope_id LIMIT 1) x
  ), o AS (
    SELECT w.scope_id, w.scope_id = ANY(CAST(:served AS text[])) AS served, coalesce(f.last_dispatch_seq, 0) AS seq
    FROM w LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = '*' AND f.scope_id = w.scope_id
    ORDER BY served, seq, w.scope_id LIMIT :n
  ), h AS MATERIALIZED (
    SELECT x.id, o.served, o.seq, x.rk FROM o CROSS JOIN LATERAL (
      SELECT id, row_number() OVER (ORDER BY b.priority DESC, b.available_at) AS rk FROM (
        SELECT id, priority, available_at FROM tasks t WHERE t.lane = :lane
          AND t.status = 'queued' AND t.scope_id = o.scope_id AND t.available_at <= :now
          AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts
        ORDER BY t.priority DESC, t.available_at LIMIT :n) b) x
  )
  SELECT t.id, false AS hinted, t.priority, t.available_at, t.scope_id, h.rk, h.served, h.seq,
         {BATCH_COST_CASE} AS cost
  FROM tasks t JOIN h ON h.id = t.id JOIN images i ON i.id = t.image_id
  WHERE t.id = ANY(ARRAY(SELECT id FROM h))
    AND t.status = 'queued' AND t.available_at <= :now AND t.lane = :lane AND NOT t.cancel_requested
    AND t.attempt_count < t.max_attempts
  ORDER BY h.rk, h.served, h.seq, t.scope_id, t.id LIMIT :n FOR UPDATE OF t SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER w AS k, sum(cost) OVER w AS total FROM cand
  WINDOW w AS (ORDER BY rk, served, seq, scope_id, id)
), pick AS (
  SELECT id FROM ranked WHERE total <= :budget OR (CAST(:at_least_one AS boolean) AND k = 1)
), mate AS (
  UPDATE tasks t SET claimed_alone = false
  WHERE t.id = ANY(CAST(:with_ids AS uuid[])) AND t.claimed_alone AND EXISTS (SELECT FROM pick)
), fair AS (
  INSERT INTO lane_fairness (lane, resource_key, scope_id, last_dispatch_seq)
  SELECT :lane, '*', d.scope_id, nextval('lane_dispatch_seq') FROM (
    SELECT cand.scope_id FROM cand JOIN pick ON pick.id = cand.id
    UNION SELECT unnest(CAST(:served AS text[]))) d ORDER BY d.scope_id
  ON CONFLICT (lane, resource_key, scope_id) DO UPDATE SET last_dispatch_seq = excluded.last_dispatch_seq
), c AS (
  UPDATE tasks t SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1, attempt_count = attempt_count + 1,
         claimed_alone = (SELECT count(*) FROM pick) + cardinality(CAST(:with_ids AS uuid[])) = 1
                         AND NOT CAST(:shared AS boolean),
         started_at = coalesce(started_at, :now), updated_at = :now
  FROM pick WHERE t.id = pick.id
  RETURNING t.id, t.scope_id, t.job_id, t.image_id, t.image_sha256, t.stage, t.lane, t.resource_key,
            t.claim_generation, t.attempt_count, t.max_attempts, t.payload, t.input_fingerprint, t.grant_id,
            t.hint_group
), s AS (
  UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,
         started_at = coalesce(js.started_at, :now), updated_at = :now
  FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')
), j AS (
  UPDATE processing_jobs pj SET status = 'running', updated_at = :now
  FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'
)
SELECT c.*, i.storage_key, cand.cost AS batch_cost
FROM c JOIN images i ON i.id = c.image_id JOIN cand ON cand.id = c.id
""")


@transition
def claim_batch_txn(
    conn: Connection, lane: str, n: int, owner: str, now: datetime, lease_s: float, *, budget: int,
    at_least_one: bool = True, served: list[str] | tuple[str, ...] = (), with_ids: list[uuid.UUID] | tuple = (),
    shared: bool = False,
) -> Outcome[RowMapping]:
    """queued → running: up to ``n`` due tasks of a batched lane within ``budget``, fairly across scopes.

    Round-robin over the least recently served scopes, so one scope's backlog delays another
    scope's task by at most ceil(waiting scopes / n) such claims. ``served``: scopes this
    transaction already claimed for (a hint's wake-up group) — served last, and recorded as
    served with the claimed ones. ``with_ids``: the tasks that group claim took — the batch the
    fill joins (a lone one of them is no longer ``claimed_alone`` once the fill claims any). One
    statement: pick (FOR UPDATE SKIP LOCKED), claim, stages and jobs to running, fairness
    recorded; the rest stay queued for their own hints. Queued tasks only: a task whose run died
    is never filled into a batch (see ``claim_group_txn``). Not matched: nothing due (or nothing
    fits what is left of the budget). ``shared``: as in ``claim_group_txn``.
    """
    return Outcome.of(conn.execute(CLAIM_FAIR_BATCH, {
        "lane": lane, "n": n, "owner": owner, "served": list(served), "now": now,
        "exp": now + timedelta(seconds=lease_s), "budget": budget, "at_least_one": at_least_one,
        "with_ids": list(with_ids), "shared": shared,
    }).mappings().all())


LOCK_HINTED = sql("SELECT id FROM tasks WHERE id = :id AND lane = :lane AND status = 'queued' FOR NO KEY UPDATE")


@transition
def lock_hinted_txn(conn: Connection, task_id: uuid.UUID, lane: str) -> Outcome[uuid.UUID]:
    """(queued, locked): wait for the hinted task if it is queued and someone holds it.

    Above all a new task joining its wake-up group (``join_open_group_txn``): the claim's next
    statement (a new snapshot) then sees every member that joined, and a later joiner finds the
    task claimed and hints for itself. Holding nothing else yet, this wait cannot close a lock
    cycle. Not matched: the task is not queued (running, finished, another lane, unknown).
    """
    return Outcome.of(conn.execute(LOCK_HINTED, {"id": task_id, "lane": lane}).scalars().all())


JOIN_OPEN_GROUP = sql("""
UPDATE tasks SET hint_members = hint_members + :k
WHERE id = (SELECT id FROM tasks WHERE scope_id = :s AND lane = :lane AND resource_key = :rk AND priority = :p
              AND status = 'queued' AND hint_group IS NULL
            ORDER BY created_at DESC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED)
  AND status = 'queued' AND attempt_count = 0 AND NOT cancel_requested AND available_at <= :now
  AND hint_members + :k < :size
RETURNING id
""")


@transition
def join_open_group_txn(
    conn: Connection, scope_id: str, lane: str, resource_key: str, priority: int, k: int, size: int,
    now: datetime,
) -> Outcome[uuid.UUID]:
    """queued group → hint_members + k: join ``k`` new tasks to the newest open wake-up group.

    Of (scope, lane, resource key, priority): its named task still queued and never claimed (so
    its hint is still ahead), room for ``k`` more under ``size``. Matched: ``row`` is the named
    task's id (the new tasks' ``hint_group``; they need no hint of their own); not matched: hint
    them yourselves. Never waits: a group whose named task is locked (being claimed, or joined by
    another writer) is passed over. The lock taken here is held to commit, so a claim of that
    hint waits for the join to land (``lock_hinted_txn``).
    """
    return Outcome.of(conn.execute(JOIN_OPEN_GROUP, {
        "s": scope_id, "lane": lane, "rk": resource_key, "p": priority, "k": k, "size": size, "now": now,
    }).scalars().all())


CLAIM_GROUP_MEMBERS = sql("""
WITH pick AS (
  SELECT id FROM tasks WHERE hint_group = :id AND status = 'queued' AND available_at <= :now
    AND lane = :lane AND NOT cancel_requested AND attempt_count < max_attempts
  ORDER BY priority DESC, available_at LIMIT :n FOR UPDATE SKIP LOCKED
), c AS (
  UPDATE tasks t SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1, attempt_count = attempt_count + 1,
         claimed_alone = NOT CAST(:shared AS boolean), started_at = coalesce(started_at, :now), updated_at = :now
  FROM pick WHERE t.id = pick.id
  RETURNING t.id, t.scope_id, t.job_id, t.image_id, t.image_sha256, t.stage, t.lane, t.resource_key,
            t.claim_generation, t.attempt_count, t.max_attempts, t.payload, t.input_fingerprint, t.grant_id,
            t.hint_group
), s AS (
  UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,
         started_at = coalesce(js.started_at, :now), updated_at = :now
  FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')
), j AS (
  UPDATE processing_jobs pj SET status = 'running', updated_at = :now
  FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'
)
SELECT c.*, i.storage_key FROM c JOIN images i ON i.id = c.image_id
""")


@transition
def claim_group_members_txn(
    conn: Connection, task_id: uuid.UUID, lane: str, n: int, owner: str, now: datetime, lease_s: float,
    shared: bool = False,
) -> Outcome[RowMapping]:
    """queued → running: up to ``n`` due members of ``task_id``'s wake-up group. Not matched: none due.

    One scope and resource key by construction (see advance._wake_groups); ``rows``: the claimed
    tasks, which the agent lane's slot assignment (``lanes.claim_group_txn``) zips with slots.
    Each is ``claimed_alone`` unless ``shared`` (its calls run beside others in one process, as
    ``claim_txn``): a death there charges none of them. A paid attempt interrupted by a death ends
    by the attempt protocol (SPEC §4.5); a recall-safe one runs again, and only a death of a run
    alone spends its attempts.
    """
    return Outcome.of(conn.execute(CLAIM_GROUP_MEMBERS, {
        "id": task_id, "lane": lane, "n": n, "owner": owner, "now": now, "exp": now + timedelta(seconds=lease_s),
        "shared": shared,
    }).mappings().all())


RUN_ALONE = sql("""
UPDATE tasks SET claimed_alone = true, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
RETURNING id
""")


@transition
def run_alone_txn(conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime) -> Outcome[uuid.UUID]:
    """running → running alone (``claimed_alone``): its execution now runs with no other in its process (fenced).

    A process that runs claims side by side (a threads pool) claims with ``shared`` — no claim of it
    is alone, so a death there is charged to none (another thread's input may have killed it). A
    task whose run died is then run with every other thread of its process held off, and marked
    alone first: a death now is its own. Not matched: fenced out (lease lost, re-claimed).
    """
    return Outcome.of(conn.execute(RUN_ALONE, {"id": task_id, "owner": owner, "gen": gen, "now": now}).scalars().all())


HEARTBEAT = sql("""
UPDATE tasks SET lease_expires_at = :exp, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
RETURNING cancel_requested
""")


@transition
def heartbeat_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, lease_s: float
) -> Outcome[RowMapping]:
    """running → running, lease extended (fenced); ``row`` has cancel_requested. Not matched: fenced out."""
    return Outcome.of(conn.execute(HEARTBEAT, {
        "id": task_id, "owner": owner, "gen": gen, "now": now, "exp": now + timedelta(seconds=lease_s),
    }).mappings().all())


NOTE_OVERRUN = sql("""
UPDATE tasks SET error = CAST(:err AS jsonb), updated_at = :now
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
RETURNING id
""")


@transition
def note_overrun_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, error: dict
) -> Outcome[uuid.UUID]:
    """running → running, ``error`` set (fenced; the lease untouched): the watchdog's note that this
    execution's provider call ran past its maximum, before it ends the worker. Not matched: fenced out."""
    return Outcome.of(conn.execute(NOTE_OVERRUN, {
        "id": task_id, "owner": owner, "gen": gen, "now": now, "err": canonical_json(error),
    }).scalars().all())


FINISH_FENCED = sql("""
UPDATE tasks SET status = :st, error = CAST(:err AS jsonb), result = CAST(:res AS jsonb),
       completed_at = :now, updated_at = :now, lease_expires_at = NULL
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
RETURNING id, scope_id, job_id, stage, lane, resource_key, attempt_count
""")


@transition
def finish_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, *, status: str,
    error: dict | None = None, result: dict | None = None,
) -> Outcome[RowMapping]:
    """running → succeeded / failed / cancelled, the current execution only (fenced). Not matched: fenced out."""
    return Outcome.of(conn.execute(FINISH_FENCED, {
        "id": task_id, "owner": owner, "gen": gen, "now": now, "st": status,
        "err": None if error is None else canonical_json(error),
        "res": None if result is None else canonical_json(result),
    }).mappings().all())


END_ABANDONED = sql("""
UPDATE tasks SET status = 'cancelled', error = CAST(:err AS jsonb), completed_at = :now, updated_at = :now,
       lease_expires_at = NULL
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
  AND cancel_requested AND lease_expires_at < :now
RETURNING id
""")


@transition
def end_abandoned_txn(conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime) -> Outcome[uuid.UUID]:
    """running (cancel requested, lease expired) → cancelled, the execution the sweep saw (fenced).

    No claim can take a cancel-requested task, so its dead worker's execution is ended here for
    it. Not matched: that execution is no longer the task's (it finished, or a claim took it after
    its cancel request was withdrawn)."""
    return Outcome.of(conn.execute(END_ABANDONED, {
        "id": task_id, "owner": owner, "gen": gen, "now": now,
        "err": canonical_json({"code": "cancelled", "message": "cancelled; its worker stopped before finishing"}),
    }).scalars().all())


LOCK_EXPIRED_LEASE = sql("""
SELECT id FROM tasks
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
  AND lease_expires_at < :now
FOR NO KEY UPDATE
""")


@transition
def lock_expired_lease_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime
) -> Outcome[uuid.UUID]:
    """(running, lease expired, locked): the execution the sweep saw still holds an expired lease.

    Taken first in the transaction that ends an exhausted task for its dead worker: the lock keeps
    the worker's heartbeat (``heartbeat_txn``) out until the end commits, and a lease the worker
    renewed between the sweep's read and this lock is not matched — the worker is alive and its
    execution is left to finish. Not matched: renewed, finished, or a claim took it."""
    return Outcome.of(conn.execute(
        LOCK_EXPIRED_LEASE, {"id": task_id, "owner": owner, "gen": gen, "now": now},
    ).scalars().all())


WITHDRAW_CANCEL = sql("""
UPDATE tasks SET cancel_requested = false, updated_at = :now
WHERE id = :id AND status = 'running' AND cancel_requested
""")


@transition
def withdraw_cancel_txn(conn: Connection, task_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """running, cancel requested → running: a job was just deduplicated onto the task (it wants its
    result), so the cancel request of the job that ended no longer holds. A dead worker's task is
    then claimable again once its lease expired. Not matched: no request to withdraw (or the task
    ended meanwhile: the sweep's stuck-jobs step moves the waiting job on)."""
    return Outcome.count(conn.execute(WITHDRAW_CANCEL, {"id": task_id, "now": now}).rowcount)


# A queued task is claimable only without a cancel request (CLAIM), so a requeue never keeps one:
# a task whose job ended while it ran, and that no open stage waits on, is ended instead
# (END_CANCEL_REQUESTED, tried first); a request some open stage still waits past speaks for no one
# and is withdrawn here, as the sweep withdraws it from an expired lease (store/sweep.py).
# ``last_hint_at`` = :hinted: when the retry's delayed hint is delivered (its available_at), so no
# fairness path or sweep hints the task again before that hint has had its chance (the sweep
# re-hints it one grace later: a lost delayed hint); NULL: no delayed hint, the sweep hints it
# once it is due.
REQUEUE_FENCED = sql("""
UPDATE tasks SET status = 'queued', available_at = :at, error = CAST(:err AS jsonb), lease_owner = NULL,
       lease_expires_at = NULL, last_hint_at = :hinted, cancel_requested = false, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'
RETURNING id, job_id, stage, lane, attempt_count
""")


@transition
def requeue_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, available_at: datetime, error: dict,
    hinted_at: datetime | None = None,
) -> Outcome[RowMapping]:
    """running → queued after a retryable error, due at ``available_at``, any cancel request
    withdrawn (fenced; call ``end_cancel_requested_txn`` first). ``hinted_at``: the caller
    publishes a delayed hint due then (``last_hint_at``), after commit; None: unhinted, left to
    the sweep. Not matched: fenced out."""
    return Outcome.of(conn.execute(REQUEUE_FENCED, {
        "id": task_id, "owner": owner, "gen": gen, "now": now, "at": available_at, "err": canonical_json(error),
        "hinted": hinted_at,
    }).mappings().all())


END_CANCEL_REQUESTED = sql("""
UPDATE tasks SET status = 'cancelled', error = CAST(:err AS jsonb), completed_at = :now, updated_at = :now,
       lease_expires_at = NULL
WHERE id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running' AND cancel_requested
  AND NOT EXISTS (SELECT 1 FROM job_stages js WHERE js.task_id = tasks.id AND js.status IN ('queued', 'running'))
RETURNING id
""")


@transition
def end_cancel_requested_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, error: dict
) -> Outcome[uuid.UUID]:
    """running (cancel requested, no open stage waits on it) → cancelled, the current execution only
    (fenced): what a retryable error of a task whose job ended while it ran comes to. Requeued, it
    could never be claimed again (CLAIM skips cancel-requested tasks) yet would stay active for
    dedupe, so a later job of its image would wait on it forever. Not matched: fenced out, no cancel
    request, or a job waits on the task (requeue it: ``requeue_fenced_txn``)."""
    return Outcome.of(conn.execute(END_CANCEL_REQUESTED, {
        "id": task_id, "owner": owner, "gen": gen, "now": now, "err": canonical_json(error),
    }).scalars().all())


CANCEL_QUEUED_TASKS_OF_JOB = sql("""
UPDATE tasks SET status = 'cancelled', error = CAST(:err AS jsonb), completed_at = :now, updated_at = :now
WHERE job_id = :j AND status = 'queued'
RETURNING id
""")

REQUEST_CANCEL_RUNNING_TASKS_OF_JOB = sql("""
UPDATE tasks SET cancel_requested = true, updated_at = :now WHERE job_id = :j AND status = 'running'
""")


@transition
def cancel_job_tasks_txn(conn: Connection, job_id: uuid.UUID, now: datetime, reason: str) -> Outcome[uuid.UUID]:
    """queued → cancelled, running → cancel_requested, for a job's tasks; ``rows`` = the cancelled ids.

    Not matched: no queued task was cancelled (none, or all running: they stop at their next
    heartbeat and are recorded by the worker's fenced abandon).
    """
    err = canonical_json({"code": reason, "message": f"job {reason}"})
    cancelled = conn.execute(CANCEL_QUEUED_TASKS_OF_JOB, {"j": job_id, "now": now, "err": err}).scalars().all()
    conn.execute(REQUEST_CANCEL_RUNNING_TASKS_OF_JOB, {"j": job_id, "now": now})
    return Outcome.of(cancelled)


CLEAR_HINT = sql("""
UPDATE tasks SET last_hint_at = NULL
WHERE id IN (SELECT id FROM tasks WHERE (id = :id OR hint_group = :id) AND status = 'queued' FOR UPDATE SKIP LOCKED)
""")


def clear_hint_txn(conn: Connection, task_id: uuid.UUID) -> int:
    """The hint naming ``task_id`` was spent without claiming it or (some of) its wake-up group:
    those still queued wait unhinted (see lanes.refused_txn, lanes.hints_after_refusal).

    Rows another transaction holds are skipped, never waited for: that transaction is claiming,
    hinting or cancelling them, and waiting here (after the claim took its fairness row and
    slots) could close a lock cycle with it.
    """
    return conn.execute(CLEAR_HINT, {"id": task_id}).rowcount


# Rows another transaction holds are skipped, never waited for: it is claiming, clearing, hinting
# or cancelling them (whoever clears a hint then settles who hints it: lanes.hints_after_refusal).
HINT_UNHINTED = sql("""
UPDATE tasks SET last_hint_at = :now
WHERE id IN (SELECT id FROM tasks WHERE id = ANY(:ids) AND status = 'queued' AND last_hint_at IS NULL
             FOR NO KEY UPDATE SKIP LOCKED)
RETURNING id
""")


@transition
def hint_unhinted_txn(conn: Connection, task_ids: list[uuid.UUID], now: datetime) -> Outcome[uuid.UUID]:
    """queued without a live hint → hinted now, of ``task_ids``: a hint naming each returned id is
    about to be published (the sweep re-hints from here). A task that already has a live hint is
    left alone: that hint claims it. Not matched: every one is hinted, taken, or locked by another
    transaction."""
    if not task_ids:
        return Outcome(False)
    return Outcome.of(conn.execute(HINT_UNHINTED, {"ids": task_ids, "now": now}).scalars().all())


# Of ``ids``, those another transaction holds locked right now (a claim, a hint, a clear in flight).
LOCKED_TASKS = sql("""
WITH c AS (SELECT id FROM tasks WHERE id = ANY(:ids)),
l AS (SELECT id FROM tasks WHERE id = ANY(:ids) FOR SHARE SKIP LOCKED)
SELECT id FROM c EXCEPT SELECT id FROM l
""")

WAIT_TASK = sql("SELECT 1 FROM tasks WHERE id = :id FOR SHARE")


def locked_tasks_txn(conn: Connection, task_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``task_ids``, those a transaction in flight holds locked (the others stay share-locked
    until the caller's short transaction ends)."""
    return list(conn.execute(LOCKED_TASKS, {"ids": task_ids}).scalars()) if task_ids else []


def wait_task_txn(conn: Connection, task_id: uuid.UUID) -> None:
    """Wait until the transaction holding the task row locked ends (the caller's transaction must
    hold nothing else and commit right away)."""
    conn.execute(WAIT_TASK, {"id": task_id}).all()


INSERT_AND_LINK_MANY = sql("""WITH r AS (SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid,
    scope_id text, job_id uuid, stage text, lane text, resource_key text, payload jsonb, input_fingerprint text,
    dedupe_key text, image_id uuid, image_sha256 text, priority int, max_attempts int, grant_id uuid,
    hint_group uuid, hint_members int, mh text)
), t AS (
  INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint, dedupe_key,
                     image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,
                     grant_id, hint_group, hint_members, created_at, updated_at)
  SELECT id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint, dedupe_key, image_id,
         image_sha256, 'queued', priority, :now, max_attempts, :now, grant_id, hint_group, hint_members, :now, :now
  FROM r
  ORDER BY job_id
  ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING
  RETURNING id, job_id, stage, grant_id, input_fingerprint
), g AS (
  UPDATE operation_grants og SET task_id = t.id, updated_at = :now FROM t
  WHERE og.id = t.grant_id AND og.id = ANY(:grant_ids)
), s AS (
  UPDATE job_stages js SET status = 'queued', task_id = t.id, input_fingerprint = t.input_fingerprint,
         error = NULL, retry_at = NULL, updated_at = :now
  FROM t WHERE js.job_id = t.job_id AND js.job_id = ANY(:job_ids) AND js.stage = t.stage
), j AS (
  UPDATE processing_jobs pj SET current_stage = t.stage, metadata_hash = coalesce(pj.metadata_hash, r.mh),
         updated_at = :now
  FROM t JOIN r ON r.id = t.id
  WHERE pj.id = t.job_id AND pj.id = ANY(:job_ids) AND pj.status IN ('queued', 'running')
)
SELECT job_id, id FROM t
""")


@transition
def insert_and_link_many_txn(
    conn: Connection, rows: list[dict[str, Any]], now: datetime
) -> Outcome[tuple[uuid.UUID, uuid.UUID]]:
    """— → queued, N tasks, their stages → queued and their active jobs' current_stage, in one statement.

    The fast path of advancing several jobs: each task bound to its operation grant, if any.
    ``rows`` are task values (with the new ``id``, its ``hint_group`` or None, and
    ``hint_members``) plus ``mh`` (the metadata hash to set on a job that has none yet). ``rows``
    of the outcome: (job id, new task id); a job missing from them has an identical active task
    already (dedupe — also against another row of the same call), and its grant is left unbound
    for the caller.
    """
    if not rows:
        return Outcome(False)
    return Outcome.of(tuple(r) for r in conn.execute(INSERT_AND_LINK_MANY, {
        "rows": dumps(rows), "now": now, "job_ids": [r["job_id"] for r in rows],
        "grant_ids": [r["grant_id"] for r in rows if r.get("grant_id") is not None],
    }))


FINISH_MANY = sql("""
WITH r AS (
  SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb))
    AS r(id uuid, owner text, gen int, st text, sst text, err jsonb, res jsonb)
), f AS (
  UPDATE tasks t SET status = r.st, error = r.err, result = r.res,
         completed_at = :now, updated_at = :now, lease_expires_at = NULL
  FROM r
  WHERE t.id = r.id AND t.id = ANY(:ids) AND t.lease_owner = r.owner AND t.claim_generation = r.gen
    AND t.status = 'running'
  RETURNING t.id, r.sst, r.err
), s AS (
  UPDATE job_stages js SET status = f.sst, error = f.err, updated_at = :now,
         completed_at = CASE WHEN f.sst = 'succeeded' THEN CAST(:now AS timestamptz) ELSE js.completed_at END
  FROM f WHERE js.task_id = f.id AND js.status IN ('queued', 'running')
  RETURNING js.task_id, js.job_id
)
SELECT f.id, ARRAY(SELECT s.job_id FROM s WHERE s.task_id = f.id ORDER BY s.job_id) AS job_ids FROM f
""")


@transition
def finish_many_txn(
    conn: Connection, rows: list[dict[str, Any]], now: datetime
) -> Outcome[tuple[uuid.UUID, list[uuid.UUID]]]:
    """running → succeeded / cancelled, N tasks (each fenced on its own) and the stages waiting on each.

    ``rows``: {id, owner, gen, st (task status), sst (stage status), err, res} — err/res dicts or
    None (nested in the one JSON document as objects: stored as jsonb, so no key order to keep).
    ``rows`` of the outcome: (task id, job ids to advance) for the tasks that landed; a task
    missing from them was fenced out.
    """
    if not rows:
        return Outcome(False)
    doc = dumps(rows)
    return Outcome.of(
        (task_id, list(job_ids))
        for task_id, job_ids in conn.execute(FINISH_MANY, {"rows": doc, "ids": [r["id"] for r in rows], "now": now})
    )


FINISHED_AS = sql("""
WITH r AS (
  SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb))
    AS r(id uuid, owner text, gen int, st text, sst text, err jsonb, res jsonb)
)
SELECT t.id, ARRAY(SELECT js.job_id FROM job_stages js WHERE js.task_id = t.id ORDER BY js.job_id) AS job_ids
FROM tasks t JOIN r ON t.id = r.id
WHERE t.id = ANY(:ids) AND t.lease_owner = r.owner AND t.claim_generation = r.gen AND t.status = r.st
  AND t.error IS NOT DISTINCT FROM r.err AND t.result IS NOT DISTINCT FROM r.res
""")


def finished_as_txn(conn: Connection, rows: list[dict[str, Any]]) -> list[tuple[uuid.UUID, list[uuid.UUID]]]:
    """Those of ``rows`` (as ``finish_many_txn`` takes them) whose task that very execution (owner,
    generation) already finished exactly so — status, error and result: a completion that
    committed but whose reply was lost, not a fencing rejection. (task id, ids of the jobs whose
    stages it finished)."""
    if not rows:
        return []
    return [(task_id, list(job_ids)) for task_id, job_ids in
            conn.execute(FINISHED_AS, {"rows": dumps(rows), "ids": [r["id"] for r in rows]})]


HINT_QUEUED_OF_JOBS = sql("""
UPDATE tasks SET last_hint_at = :now
WHERE id IN (
  SELECT t.id FROM job_stages js JOIN tasks t ON t.id = js.task_id
  WHERE js.job_id = ANY(:jobs) AND js.status = 'queued' AND t.status = 'queued' AND t.available_at <= :now
  ORDER BY t.id FOR UPDATE OF t SKIP LOCKED)
RETURNING id, lane, hint_group
""")


def hint_queued_of_jobs_txn(conn: Connection, job_ids: list[uuid.UUID], now: datetime) -> list[RowMapping]:
    """The due queued tasks that open stages of ``job_ids`` wait on, marked hinted now (the caller
    publishes after commit); (id, lane, hint_group). Rows another transaction holds are skipped:
    it is claiming or hinting them."""
    if not job_ids:
        return []
    return list(conn.execute(HINT_QUEUED_OF_JOBS, {"jobs": list(job_ids), "now": now}).mappings())
