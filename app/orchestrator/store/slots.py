"""Lane slots and fairness (SPEC §4.10): DB-wide concurrency slots and round-robin dispatch.

A slot is held by (task_id, claim_generation); every release or extension is fenced by that
pair. A slot is free when it has no holder or its holder is no longer running with the
generation it took the slot with (the holder finished or was re-claimed by a newer execution).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import Outcome, sql, transition

# Both fairness reads below walk the waiting (resource key, scope) pairs of a lane with a loose
# index scan over ix_tasks_claimable (cost follows the number of waiting pairs, not the backlog) and take each pair's best
# due task (priority, then age) with the pair's last dispatch: the same two CTEs, spelled out in each
# (FAIREST_QUEUED takes each pair's best :n, so :n freed slots are all refilled when fewer pairs wait).
FAIRER_SCOPE_WAITING = sql("""
WITH RECURSIVE w AS (
  (SELECT resource_key, scope_id FROM tasks WHERE lane = :lane AND status = 'queued'
   ORDER BY resource_key, scope_id LIMIT 1)
  UNION ALL
  SELECT n.resource_key, n.scope_id FROM w, LATERAL (SELECT resource_key, scope_id FROM tasks
    WHERE lane = :lane AND status = 'queued' AND (resource_key, scope_id) > (w.resource_key, w.scope_id)
    ORDER BY resource_key, scope_id LIMIT 1) n
), h AS (
  SELECT c.id, c.lane, w.scope_id, w.resource_key, c.priority, c.created_at,
         coalesce(f.last_dispatch_seq, 0) AS seq FROM w
  LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = w.resource_key AND f.scope_id = w.scope_id
  CROSS JOIN LATERAL (SELECT id, lane, priority, created_at FROM tasks t WHERE t.lane = :lane
    AND t.status = 'queued' AND t.resource_key = w.resource_key AND t.scope_id = w.scope_id
    AND t.available_at <= :now AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts
    ORDER BY t.priority DESC, t.created_at LIMIT 1) c
)
SELECT EXISTS (SELECT 1 FROM h WHERE h.resource_key = :rk AND h.scope_id <> :s
               AND h.seq < coalesce((SELECT last_dispatch_seq FROM lane_fairness WHERE lane = :lane
                                     AND resource_key = :rk AND scope_id = :s), 0))
""")

FAIREST_QUEUED = sql("""
WITH RECURSIVE w AS (
  (SELECT resource_key, scope_id FROM tasks WHERE lane = :lane AND status = 'queued'
   ORDER BY resource_key, scope_id LIMIT 1)
  UNION ALL
  SELECT n.resource_key, n.scope_id FROM w, LATERAL (SELECT resource_key, scope_id FROM tasks
    WHERE lane = :lane AND status = 'queued' AND (resource_key, scope_id) > (w.resource_key, w.scope_id)
    ORDER BY resource_key, scope_id LIMIT 1) n
)
SELECT c.id, c.lane, w.scope_id, w.resource_key, c.priority, c.created_at,
         coalesce(f.last_dispatch_seq, 0) AS seq FROM w
  LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = w.resource_key AND f.scope_id = w.scope_id
  CROSS JOIN LATERAL (SELECT id, lane, priority, created_at,
                             row_number() OVER (ORDER BY t.priority DESC, t.created_at) AS rk
    FROM tasks t WHERE t.lane = :lane
    AND t.status = 'queued' AND t.resource_key = w.resource_key AND t.scope_id = w.scope_id
    AND t.available_at <= :now AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts
    ORDER BY t.priority DESC, t.created_at LIMIT :n) c
ORDER BY c.rk, seq, c.priority DESC, c.created_at LIMIT :n
""")


COUNT_SLOTS = sql("SELECT count(*) FROM lane_slots WHERE lane = :lane AND resource_key = :rk AND slot_no < :limit")

# The pool's missing slot rows 0..limit-1, free (rows are never deleted).
INSERT_SLOTS = sql("""
INSERT INTO lane_slots (lane, resource_key, slot_no, updated_at)
SELECT :lane, :rk, g, :now FROM generate_series(0, :limit - 1) g
ON CONFLICT DO NOTHING
""")


@transition
def ensure_slots_txn(conn: Connection, lane: str, resource_key: str, limit: int, now: datetime) -> Outcome[None]:
    """— → free: create the pool's slot rows 0..limit-1 on demand. Not matched: every row exists,
    committed (visible to everyone from now on); matched: some were inserted in this (uncommitted)
    transaction.

    A plain read first: once the rows exist (the steady state) no INSERT runs, because a
    speculative insert would wait on slot rows that concurrent claimers hold locked. An INSERT that
    inserts nothing found every row committed (ON CONFLICT waits for a concurrent inserter's end).
    """
    have = conn.execute(COUNT_SLOTS, {"lane": lane, "rk": resource_key, "limit": limit}).scalar_one()
    if have >= limit:
        return Outcome(False)
    return Outcome.count(conn.execute(
        INSERT_SLOTS, {"lane": lane, "rk": resource_key, "limit": limit, "now": now}
    ).rowcount)


# The slot a re-claimed task still holds (its earlier execution's lease expired) moves to the new generation.
TAKE_OVER = sql("""
UPDATE lane_slots SET claim_generation = :gen, lease_expires_at = :exp, updated_at = :now
WHERE lane = :lane AND resource_key = :rk AND task_id = :t
""")


@transition
def take_over_txn(
    conn: Connection, lane: str, resource_key: str, task_id: uuid.UUID, gen: int, expires: datetime, now: datetime
) -> Outcome[None]:
    """held by the task → held by its new generation (a re-claim after an expired lease). Not
    matched: the task holds no slot of the pool (take a free one)."""
    return Outcome.count(conn.execute(TAKE_OVER, {
        "lane": lane, "rk": resource_key, "t": task_id, "gen": gen, "exp": expires, "now": now,
    }).rowcount)


# A CTE is evaluated once; a LIMIT subquery in FROM may be rescanned per target row. Only the slot
# row's own columns decide "free": after SKIP LOCKED takes a row lock, PostgreSQL re-checks the
# WHERE clause on the newest row version, but a subquery on `tasks` would still see the statement's
# older snapshot and could steal a slot that a concurrent claim just took. Terminal transitions
# release slots in their own transaction; a dead holder's slot frees itself when its lease expires.
TAKE_FREE = sql("""
WITH pick AS (SELECT slot_no FROM lane_slots ls WHERE lane = :lane AND resource_key = :rk
              AND slot_no < :limit AND (ls.task_id IS NULL OR ls.lease_expires_at < :now)
              ORDER BY slot_no LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE lane_slots s SET task_id = :t, claim_generation = :gen, lease_expires_at = :exp, updated_at = :now
FROM pick
WHERE s.lane = :lane AND s.resource_key = :rk AND s.slot_no = pick.slot_no RETURNING s.slot_no
""")


@transition
def take_free_txn(
    conn: Connection, lane: str, resource_key: str, limit: int, task_id: uuid.UUID, gen: int, expires: datetime,
    now: datetime,
) -> Outcome[int]:
    """free (no holder, or its lease expired) → held: one slot below ``limit``; slots other claimers
    are taking right now are skipped. ``row``: the slot number. Not matched: no free slot."""
    return Outcome.of(conn.execute(TAKE_FREE, {
        "lane": lane, "rk": resource_key, "limit": limit, "t": task_id, "gen": gen, "exp": expires, "now": now,
    }).scalars().all())


EXTEND = sql("""
UPDATE lane_slots SET lease_expires_at = :exp, updated_at = :now WHERE task_id = :t AND claim_generation = :gen
""")


@transition
def extend_txn(conn: Connection, task_id: uuid.UUID, gen: int, expires: datetime, now: datetime) -> Outcome[None]:
    """held → held, lease extended (fenced by task and generation). Not matched: this execution
    holds no slot (none was needed, or it was freed as an orphan after its lease expired)."""
    return Outcome.count(conn.execute(EXTEND, {"t": task_id, "gen": gen, "exp": expires, "now": now}).rowcount)


# Live-held only (TAKE_FREE's "free", negated): a slot whose holder's lease expired is free already.
HELD_BY_IMAGE = sql("""
SELECT ls.lane, count(*) AS n FROM tasks t JOIN lane_slots ls ON ls.task_id = t.id
WHERE t.scope_id = :s AND t.image_id = :i AND ls.lease_expires_at >= :now GROUP BY ls.lane
""")


def held_by_image_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, now: datetime) -> list[tuple[str, int]]:
    """(lane, slots) the image's tasks hold live: what deleting the image frees (the rows' cascade
    sets the slots' holder to NULL). A slot whose lease expired (a died task not yet re-claimed) is
    free already, so it is not counted."""
    return [(r.lane, int(r.n)) for r in conn.execute(HELD_BY_IMAGE, {"s": scope_id, "i": image_id, "now": now})]


# Free the slots one execution (task, generation) holds — also the orphan sweep's per-slot re-check.
RELEASE = sql("""
UPDATE lane_slots SET task_id = NULL, claim_generation = NULL, lease_expires_at = NULL, updated_at = :now
WHERE task_id = :t AND claim_generation = :gen
""")


@transition
def release_txn(conn: Connection, task_id: uuid.UUID, gen: int, now: datetime) -> Outcome[None]:
    """held → free: every slot this execution holds (fenced by generation). Not matched: it held none."""
    return Outcome.count(conn.execute(RELEASE, {"t": task_id, "gen": gen, "now": now}).rowcount)


RELEASE_MANY = sql("""
UPDATE lane_slots s SET task_id = NULL, claim_generation = NULL, lease_expires_at = NULL, updated_at = :now
FROM unnest(CAST(:tasks AS uuid[]), CAST(:gens AS bigint[])) AS h(t, gen)
WHERE s.task_id = h.t AND s.task_id = ANY(:tasks) AND s.claim_generation = h.gen
""")


@transition
def release_many_txn(conn: Connection, holders: list[tuple[uuid.UUID, int]], now: datetime) -> Outcome[None]:
    """held → free for several executions (task id, generation), one statement. Not matched: none held one."""
    if not holders:
        return Outcome(False)
    return Outcome.count(conn.execute(RELEASE_MANY, {
        "tasks": [t for t, _ in holders], "gens": [g for _, g in holders], "now": now,
    }).rowcount)


# Held slots whose holder is not running with that generation, or whose lease expired.
ORPHAN_SLOTS = sql("""
SELECT ls.task_id, ls.claim_generation FROM lane_slots ls WHERE ls.task_id IS NOT NULL
  AND (ls.lease_expires_at < :now OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = ls.task_id
       AND t.status = 'running' AND t.claim_generation = ls.claim_generation))
""")


@transition
def release_orphans_txn(conn: Connection, now: datetime) -> Outcome[tuple[uuid.UUID, int]]:
    """held by a finished, re-claimed or expired execution → free (the sweep). ``rows``: one
    (task id, generation) per slot freed. Not matched: no orphan (the usual case).

    Two statements: candidates are found on one snapshot, then each is freed only if the slot
    still names the same (task, generation) — a row-level re-check that cannot free a slot a
    concurrent claim took after the snapshot.
    """
    freed: list[tuple[uuid.UUID, int]] = []
    for task_id, gen in conn.execute(ORPHAN_SLOTS, {"now": now}).all():
        # one holder may have a slot in two pools: the first candidate frees both
        freed += [(task_id, gen)] * conn.execute(RELEASE, {"t": task_id, "gen": gen, "now": now}).rowcount
    return Outcome.of(freed)


def record_dispatch_txn(conn: Connection, lane: str, resource_key: str, scope_id: str) -> None:
    """This (lane, resource_key, scope) was just dispatched: it goes to the back of the round."""
    conn.execute(
        sql(
            "INSERT INTO lane_fairness (lane, resource_key, scope_id, last_dispatch_seq)"
            " VALUES (:lane, :rk, :s, nextval('lane_dispatch_seq'))"
            " ON CONFLICT (lane, resource_key, scope_id) DO UPDATE SET last_dispatch_seq = EXCLUDED.last_dispatch_seq"
        ),
        {"lane": lane, "rk": resource_key, "s": scope_id},
    )


def fairer_scope_waiting_txn(conn: Connection, lane: str, resource_key: str, scope_id: str, now: datetime) -> bool:
    """Does another scope with a due task in this (lane, resource_key) wait longer than ``scope_id``?"""
    return conn.execute(
        FAIRER_SCOPE_WAITING,
        {"lane": lane, "rk": resource_key, "s": scope_id, "now": now},
    ).scalar_one()


# A due task of the lane waits with no live hint (a refusal or a retry's requeue cleared it). Spelled
# out in ADMIT_FIRST too (its ``unhinted`` column), checked equal by tests/unit/test_fairness_sql.py.
UNHINTED_WAITING = sql("""
SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND last_hint_at IS NULL
               AND lane = :lane AND available_at <= :now)
""")


def unhinted_waiting_txn(conn: Connection, lane: str, now: datetime) -> bool:
    """Is a due queued task of ``lane`` waiting with no live hint (``last_hint_at`` cleared)?"""
    return conn.execute(UNHINTED_WAITING, {"lane": lane, "now": now}).scalar_one()


# Live-held slots of a pool (TAKE_FREE's "free", negated); a pool's missing rows are free.
HELD_COUNT = sql("""
SELECT count(*) FROM lane_slots WHERE lane = :lane AND resource_key = :rk AND slot_no < :limit
  AND task_id IS NOT NULL AND lease_expires_at >= :now
""")


def free_count_txn(conn: Connection, lane: str, pools: list[tuple[str, int]], now: datetime) -> int:
    """How many more claims the pools admit now: the fewest free slots of any of them."""
    return min((limit - conn.execute(HELD_COUNT, {"lane": lane, "rk": key, "limit": limit, "now": now}).scalar_one()
                for key, limit in pools), default=0)


# Held slot rows of the pools that another transaction holds locked right now (being released,
# extended or taken over; uncommitted): the held rows this snapshot sees, less those it can
# share-lock. The rows it could lock stay share-locked until the caller's (short) transaction
# ends; claimers never wait for them (they take free rows only).
LOCKED_HELD = sql("""
WITH held AS (SELECT resource_key, slot_no FROM lane_slots
              WHERE lane = :lane AND resource_key = ANY(:keys) AND task_id IS NOT NULL),
lockable AS (SELECT resource_key, slot_no FROM lane_slots
             WHERE lane = :lane AND resource_key = ANY(:keys) AND task_id IS NOT NULL FOR SHARE SKIP LOCKED)
SELECT resource_key, slot_no FROM held EXCEPT SELECT resource_key, slot_no FROM lockable
""")

WAIT_SLOT = sql("SELECT 1 FROM lane_slots WHERE lane = :lane AND resource_key = :rk AND slot_no = :n FOR SHARE")

# The rest of the transaction waits for a lock at most :ms (SET LOCAL: it ends with the transaction).
BOUND_LOCK_WAITS = sql("SELECT set_config('lock_timeout', :ms, true)")


def locked_held_txn(conn: Connection, lane: str, keys: list[str]) -> list[tuple[str, int]]:
    """(resource key, slot no) of the pools' held slots that a transaction in flight holds locked."""
    return [(r.resource_key, int(r.slot_no)) for r in conn.execute(LOCKED_HELD, {"lane": lane, "keys": keys})]


def wait_slot_txn(conn: Connection, lane: str, resource_key: str, slot_no: int) -> None:
    """Wait until the transaction holding the slot row locked ends (share-locks it until this
    transaction ends: the caller's transaction must hold nothing else and commit right away)."""
    conn.execute(WAIT_SLOT, {"lane": lane, "rk": resource_key, "n": slot_no}).all()


def bound_lock_waits_txn(conn: Connection, timeout_ms: int) -> None:
    """From now until this transaction ends, a lock wait gives up after ``timeout_ms`` (at least
    1 ms) instead of the engine's lock_timeout, raising lock_not_available (SQLSTATE 55P03)."""
    conn.execute(BOUND_LOCK_WAITS, {"ms": f"{max(1, int(timeout_ms))}ms"}).all()


def fairest_queued_txn(conn: Connection, lane: str, now: datetime, n: int = 1) -> list[RowMapping]:
    """The next ``n`` tasks to dispatch: least recently served scope first, then priority, then age —
    in turns, every waiting scope's best task, then every scope's second …, so ``n`` freed slots get
    ``n`` tasks even when fewer scopes wait."""
    return list(
        conn.execute(
            FAIREST_QUEUED,
            {"lane": lane, "now": now, "n": n},
        ).mappings()
    )


def lock_free_txn(conn: Connection, lane: str, resource_key: str, limit: int, n: int, now: datetime) -> list[int]:
    """Lock up to ``n`` free slots below ``limit`` until the transaction ends (skipping slots others
    are taking); ``assign_txn`` then gives them to claimed tasks, the rest stay free."""
    return list(
        conn.execute(
            sql(
                "SELECT slot_no FROM lane_slots WHERE lane = :lane AND resource_key = :rk AND slot_no < :limit"
                " AND (task_id IS NULL OR lease_expires_at < :now) ORDER BY slot_no LIMIT :n FOR UPDATE SKIP LOCKED"
            ),
            {"lane": lane, "rk": resource_key, "limit": limit, "n": n, "now": now},
        ).scalars()
    )


ASSIGN = sql("""
UPDATE lane_slots s SET task_id = h.t, claim_generation = h.gen, lease_expires_at = :exp, updated_at = :now
FROM unnest(CAST(:slots AS int[]), CAST(:tasks AS uuid[]), CAST(:gens AS bigint[])) AS h(slot_no, t, gen)
WHERE s.lane = :lane AND s.resource_key = :rk AND s.slot_no = h.slot_no
""")


@transition
def assign_txn(
    conn: Connection, lane: str, resource_key: str, slot_nos: list[int], holders: list, expires: datetime,
    now: datetime,
) -> Outcome[None]:
    """free, locked by ``lock_free_txn`` → held: the slots given to claimed tasks (rows with id,
    claim_generation), pairwise. Not matched: nothing to assign (no slot or no task)."""
    if not slot_nos:
        return Outcome(False)
    return Outcome.count(conn.execute(ASSIGN, {
        "lane": lane, "rk": resource_key, "slots": slot_nos, "tasks": [r["id"] for r in holders],
        "gens": [r["claim_generation"] for r in holders], "exp": expires, "now": now,
    }).rowcount)


# A first claim's admission in one statement (lanes.acquire_slot_txn's common case, issue 21): the
# fairness check (FAIRER_SCOPE_WAITING's two CTEs, spelled out), then — only when no fairer scope
# waits (a one-time filter: nothing is locked otherwise) — one free slot per pool locked SKIP
# LOCKED, taken only if every pool had one, and the scope's dispatch recorded with the slots. Every
# data-modifying CTE runs on the statement's one snapshot, as the three statements it replaces ran
# on theirs: the slot rows' own columns decide "free" (see TAKE_FREE), and a refused claim (fairer
# scope, or a pool without a free slot) changes nothing here — its transaction is rolled back. An
# admitted claim also learns whether a due task waits unhinted (UNHINTED_WAITING, spelled out): only
# then does it look for free slots to hint (lanes.top_up_txn) — no extra round trip otherwise.
ADMIT_FIRST = sql("""
WITH RECURSIVE w AS (
  (SELECT resource_key, scope_id FROM tasks WHERE lane = :lane AND status = 'queued'
   ORDER BY resource_key, scope_id LIMIT 1)
  UNION ALL
  SELECT n.resource_key, n.scope_id FROM w, LATERAL (SELECT resource_key, scope_id FROM tasks
    WHERE lane = :lane AND status = 'queued' AND (resource_key, scope_id) > (w.resource_key, w.scope_id)
    ORDER BY resource_key, scope_id LIMIT 1) n
), h AS (
  SELECT c.id, c.lane, w.scope_id, w.resource_key, c.priority, c.created_at,
         coalesce(f.last_dispatch_seq, 0) AS seq FROM w
  LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = w.resource_key AND f.scope_id = w.scope_id
  CROSS JOIN LATERAL (SELECT id, lane, priority, created_at FROM tasks t WHERE t.lane = :lane
    AND t.status = 'queued' AND t.resource_key = w.resource_key AND t.scope_id = w.scope_id
    AND t.available_at <= :now AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts
    ORDER BY t.priority DESC, t.created_at LIMIT 1) c
), fair AS MATERIALIZED (
  SELECT EXISTS (SELECT 1 FROM h WHERE h.resource_key = :rk AND h.scope_id <> :s
                 AND h.seq < coalesce((SELECT last_dispatch_seq FROM lane_fairness WHERE lane = :lane
                                       AND resource_key = :rk AND scope_id = :s), 0)) AS fairer
), pick AS MATERIALIZED (
  SELECT p.rk, x.slot_no FROM unnest(CAST(:keys AS text[]), CAST(:limits AS int[])) AS p(rk, lim)
  CROSS JOIN LATERAL (SELECT slot_no FROM lane_slots ls WHERE ls.lane = :lane AND ls.resource_key = p.rk
    AND ls.slot_no < p.lim AND (ls.task_id IS NULL OR ls.lease_expires_at < :now)
    ORDER BY ls.slot_no LIMIT 1 FOR UPDATE SKIP LOCKED) x
  WHERE NOT (SELECT fairer FROM fair)
), ok AS MATERIALIZED (
  SELECT count(*) = cardinality(CAST(:keys AS text[])) AS admitted FROM pick
), take AS (
  UPDATE lane_slots s SET task_id = :t, claim_generation = :gen, lease_expires_at = :exp, updated_at = :now
  FROM pick WHERE (SELECT admitted FROM ok) AND s.lane = :lane AND s.resource_key = pick.rk
    AND s.slot_no = pick.slot_no
  RETURNING s.slot_no
), dispatch AS (
  INSERT INTO lane_fairness (lane, resource_key, scope_id, last_dispatch_seq)
  SELECT :lane, :rk, :s, nextval('lane_dispatch_seq') WHERE (SELECT admitted FROM ok)
  ON CONFLICT (lane, resource_key, scope_id) DO UPDATE SET last_dispatch_seq = EXCLUDED.last_dispatch_seq
)
SELECT (SELECT fairer FROM fair) AS fairer, (SELECT admitted FROM ok) AS admitted,
       (SELECT count(*) FROM take) AS taken,
       CASE WHEN (SELECT admitted FROM ok) THEN (
SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND last_hint_at IS NULL
               AND lane = :lane AND available_at <= :now)
       ) ELSE false END AS unhinted
""")


@transition
def admit_first_txn(
    conn: Connection, lane: str, resource_key: str, scope_id: str, pools: list[tuple[str, int]],
    task_id: uuid.UUID, gen: int, expires: datetime, now: datetime,
) -> Outcome[RowMapping]:
    """free → held, one slot per pool, and the scope to the back of the round: a first claim's
    admission (fairer_scope_waiting_txn, take_free_txn per pool, record_dispatch_txn) in one
    statement. Matched: admitted (``row``: fairer, admitted, taken, unhinted). Not matched: refused — a fairer
    scope waits (``row.fairer``) or a pool had no free slot — and nothing was written. ``pools``:
    (resource key, limit) of each pool, their slot rows known to exist (``ensure_slots_txn``)."""
    row = conn.execute(ADMIT_FIRST, {
        "lane": lane, "rk": resource_key, "s": scope_id, "keys": [k for k, _ in pools],
        "limits": [n for _, n in pools], "t": task_id, "gen": gen, "exp": expires, "now": now,
    }).mappings().one()
    return Outcome(bool(row["admitted"]), (row,), int(row["taken"]))
