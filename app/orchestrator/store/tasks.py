"""Leaf tasks: create (deduplicated), claim, heartbeat and the fenced terminal transitions.

Every write after a claim is conditioned on (task id, lease_owner, claim_generation,
status = 'running'); zero rows means the caller was fenced out.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import sql

FENCE = "id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'"

_CLAIM_RETURNING = (
    "id, scope_id, job_id, image_id, image_sha256, stage, lane, resource_key, claim_generation, attempt_count,"
    " max_attempts, payload, input_fingerprint, grant_id, hint_group"
)


# The claim's writes, shared by the single and the batched claim: a new execution (generation
# + 1, lease, attempt) ...
_CLAIM_SET = (
    " status = 'running', lease_owner = :owner, lease_expires_at = :exp,"
    " claim_generation = claim_generation + 1, attempt_count = attempt_count + 1,"
    " started_at = coalesce(started_at, :now), updated_at = :now"
)
# ... and, in the same statement, the claimed tasks' waiting stages and queued jobs to running.
_CLAIMED_STAGES_AND_JOBS = (
    ", s AS ("
    " UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,"
    " started_at = coalesce(js.started_at, :now), updated_at = :now"
    " FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')"
    "), j AS ("
    " UPDATE processing_jobs pj SET status = 'running', updated_at = :now"
    " FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'"
    ")"
)
_CLAIMED_TO_RUNNING = _CLAIMED_STAGES_AND_JOBS + " SELECT c.*, i.storage_key FROM c JOIN images i ON i.id = c.image_id"

# What one task of a batched lane costs the worker that holds the batch in memory, read from its
# image row: decoded pixels (visual), or the characters its semantic document is rendered from
# (embedding: the display name and the context's JSON text, which is at least as long as the
# rendered fields). A batch claims a prefix of its candidates whose costs sum within the lane's
# budget (``lanes.lane_batch_budget``).
BATCH_COST = {
    "visual": "i.width::bigint * i.height",
    "embedding": "coalesce(length(i.display_name), 0) + coalesce(length(i.context::text), 0)",
}


def insert_task_txn(conn: Connection, values: dict[str, Any], now: datetime) -> tuple[uuid.UUID, str, bool]:
    """Create a queued task, or return the identical active one (same dedupe key in the scope).

    Returns (task id, its status, created). ``last_hint_at`` is set now: the caller publishes the
    hint right after commit, and the sweep re-hints if that publish is lost.
    """
    row = conn.execute(
        sql(
            "INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint,"
            " dedupe_key, image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,"
            " created_at, updated_at)"
            " VALUES (:id, :scope_id, :job_id, :stage, :lane, :resource_key, CAST(:payload AS jsonb),"
            " :input_fingerprint, :dedupe_key, :image_id, :image_sha256, 'queued', :priority, :now, :max_attempts,"
            " :now, :now, :now)"
            " ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING RETURNING id"
        ),
        {**values, "id": uuid.uuid4(), "payload": canonical_json(values["payload"]), "now": now},
    ).first()
    if row is not None:
        return row[0], "queued", True
    existing = conn.execute(
        sql(
            "SELECT id, status FROM tasks WHERE scope_id = :s AND dedupe_key = :k"
            " AND status IN ('queued', 'running')"
        ),
        {"s": values["scope_id"], "k": values["dedupe_key"]},
    ).first()
    if existing is None:  # it finished between our insert and select: create a fresh one
        return insert_task_txn(conn, values, now)
    return existing[0], existing[1], False


def claim_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, now: datetime, lease_s: float, lane: str | None = None
) -> RowMapping | None:
    """The one road into 'running': queued and due, or running with an expired lease.

    Bumps claim_generation (the fencing token) and moves the waiting stage(s) and job to running,
    all in one statement.
    """
    return (
        conn.execute(
            sql(
                "WITH c AS ("
                " UPDATE tasks SET" + _CLAIM_SET +
                " WHERE id = :id AND NOT cancel_requested AND attempt_count < max_attempts"
                " AND (CAST(:lane AS text) IS NULL OR lane = :lane)"
                " AND ((status = 'queued' AND available_at <= :now)"
                "  OR (status = 'running' AND lease_expires_at < :now))"
                f" RETURNING {_CLAIM_RETURNING}"
                ")" + _CLAIMED_TO_RUNNING
            ),
            {"id": task_id, "owner": owner, "now": now, "exp": now + timedelta(seconds=lease_s), "lane": lane},
        )
        .mappings()
        .first()
    )


_CLAIMABLE = "lane = :lane AND NOT cancel_requested AND attempt_count < max_attempts"


def _claim_picked_txn(conn: Connection, pick: str, params: dict[str, Any], now: datetime,
                      lease_s: float) -> list[RowMapping]:
    """Claim the rows ``pick`` (a ``SELECT id … FOR UPDATE SKIP LOCKED``) chooses, in the statement
    that also moves their stages and queued jobs to running (the batched claims' shared shape)."""
    return list(
        conn.execute(
            sql(
                "WITH pick AS (" + pick + "), c AS ("
                " UPDATE tasks t SET" + _CLAIM_SET +
                f" FROM pick WHERE t.id = pick.id RETURNING t.{_CLAIM_RETURNING.replace(', ', ', t.')}"
                ")" + _CLAIMED_TO_RUNNING
            ),
            {**params, "now": now, "exp": now + timedelta(seconds=lease_s)},
        )
        .mappings()
        .all()
    )


def _claim_within_budget_txn(
    conn: Connection, candidates: str, params: dict[str, Any], now: datetime, lease_s: float, *, budget: int,
    at_least_one: bool, order: str = "hinted DESC, priority DESC, available_at, id", also: str = "",
) -> tuple[list[RowMapping], int]:
    """Claim the longest prefix of ``candidates`` whose costs sum within ``budget`` — or, with
    ``at_least_one``, at least the first candidate however large (a huge image is never starved) —
    in the statement that also moves their stages and queued jobs to running.

    ``candidates`` is a ``SELECT t.id, hinted, t.priority, t.available_at, <cost> AS cost … FOR
    UPDATE OF t SKIP LOCKED`` over tasks ``t`` joined to their images ``i``; the prefix is taken
    in (hinted first, priority, age, id) order, or ``order`` (over the candidates' columns).
    Candidates left out stay queued (locked until this transaction ends). ``also``: further
    ``, name AS (…)`` writes of the same statement, which may read ``cand`` and ``pick``. Returns
    the claimed rows (with their ``batch_cost``) and how many candidates were left out.
    """
    rows = list(
        conn.execute(
            sql(
                "WITH cand AS MATERIALIZED (" + candidates + "), ranked AS ("
                " SELECT id, row_number() OVER w AS k, sum(cost) OVER w AS total FROM cand"
                f" WINDOW w AS (ORDER BY {order})"
                "), pick AS ("
                " SELECT id FROM ranked WHERE total <= :budget OR (CAST(:at_least_one AS boolean) AND k = 1)"
                ")" + also + ", c AS ("
                " UPDATE tasks t SET" + _CLAIM_SET +
                f" FROM pick WHERE t.id = pick.id RETURNING t.{_CLAIM_RETURNING.replace(', ', ', t.')}"
                ")" + _CLAIMED_STAGES_AND_JOBS +
                " SELECT c.*, i.storage_key, cand.cost AS batch_cost,"
                " (SELECT count(*) FROM cand) - (SELECT count(*) FROM pick) AS left_out"
                " FROM c JOIN images i ON i.id = c.image_id JOIN cand ON cand.id = c.id"
            ),
            {**params, "now": now, "exp": now + timedelta(seconds=lease_s), "budget": budget,
             "at_least_one": at_least_one},
        )
        .mappings()
        .all()
    )
    return rows, (int(rows[0]["left_out"]) if rows else 0)


# Batched lanes' fairness: the scopes with due queued tasks in a lane (a loose index scan over
# ix_tasks_lane_scope_due, so its cost follows the number of waiting scopes, not the backlog),
# the :n least recently served of them (lane_fairness at resource key '*'; scopes in :served were
# just served by this transaction's group claim, so they go last), each scope's :n best due tasks
# ranked within the scope (rk), locked SKIP LOCKED in round-robin order — every scope's first
# task, then every scope's second …
_FAIR_CANDIDATES = (
    "WITH RECURSIVE w AS ("
    " (SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued' AND available_at <= :now"
    "  AND NOT cancel_requested AND attempt_count < max_attempts ORDER BY scope_id LIMIT 1)"
    " UNION ALL"
    " SELECT x.scope_id FROM w, LATERAL (SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued'"
    "  AND scope_id > w.scope_id AND available_at <= :now AND NOT cancel_requested"
    "  AND attempt_count < max_attempts ORDER BY scope_id LIMIT 1) x"
    "), o AS ("
    " SELECT w.scope_id, w.scope_id = ANY(CAST(:served AS text[])) AS served, coalesce(f.last_dispatch_seq, 0) AS seq"
    " FROM w LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = '*' AND f.scope_id = w.scope_id"
    " ORDER BY served, seq, w.scope_id LIMIT :n"
    "), h AS ("
    " SELECT x.id, o.served, o.seq, x.rk FROM o CROSS JOIN LATERAL ("
    "  SELECT id, row_number() OVER (ORDER BY b.priority DESC, b.available_at) AS rk FROM ("
    "  SELECT id, priority, available_at FROM tasks t WHERE t.lane = :lane"
    "  AND t.status = 'queued' AND t.scope_id = o.scope_id AND t.available_at <= :now"
    "  AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts"
    "  ORDER BY t.priority DESC, t.available_at LIMIT :n) b) x"
    ")"
    " SELECT t.id, false AS hinted, t.priority, t.available_at, t.scope_id, h.rk, h.served, h.seq, {cost} AS cost"
    " FROM tasks t JOIN h ON h.id = t.id JOIN images i ON i.id = t.image_id"
    " WHERE t.status = 'queued' AND t.available_at <= :now AND t.lane = :lane AND NOT t.cancel_requested"
    " AND t.attempt_count < t.max_attempts"
    " ORDER BY h.rk, h.served, h.seq, t.scope_id, t.id LIMIT :n FOR UPDATE OF t SKIP LOCKED"
)
# ... and, in the same statement, the claimed scopes (and the group's) move to the back: one
# upsert in scope order, so concurrent claimers queue on the same rows in the same order.
_RECORD_SERVED = (
    ", fair AS ("
    " INSERT INTO lane_fairness (lane, resource_key, scope_id, last_dispatch_seq)"
    " SELECT :lane, '*', d.scope_id, nextval('lane_dispatch_seq') FROM ("
    "  SELECT cand.scope_id FROM cand JOIN pick ON pick.id = cand.id"
    "  UNION SELECT unnest(CAST(:served AS text[]))) d ORDER BY d.scope_id"
    " ON CONFLICT (lane, resource_key, scope_id) DO UPDATE SET last_dispatch_seq = excluded.last_dispatch_seq"
    ")"
)


def claim_batch_txn(
    conn: Connection, lane: str, n: int, owner: str, now: datetime, lease_s: float, *, budget: int,
    at_least_one: bool = True, served: list[str] | tuple[str, ...] = (),
) -> list[RowMapping]:
    """Claim up to ``n`` due queued tasks of a batched lane at once whose costs (``BATCH_COST``)
    sum within ``budget``, fairly across scopes: round-robin over the least recently served scopes
    (``_FAIR_CANDIDATES``), so one scope's backlog delays another scope's task by at most
    ceil(waiting scopes / n) such claims. ``served``: scopes this transaction already claimed for
    (a hint's wake-up group) — served last, and recorded as served with the claimed ones. One
    statement: pick (FOR UPDATE SKIP LOCKED), claim, stages and jobs to running, fairness recorded;
    the rest stay queued for their own hints."""
    rows, _ = _claim_within_budget_txn(
        conn, _FAIR_CANDIDATES.format(cost=BATCH_COST[lane]),
        {"lane": lane, "n": n, "owner": owner, "served": list(served)}, now, lease_s, budget=budget,
        at_least_one=at_least_one, order="rk, served, seq, scope_id, id", also=_RECORD_SERVED,
    )
    return rows


def claim_group_txn(
    conn: Connection, task_id: uuid.UUID, lane: str, owner: str, now: datetime, lease_s: float, *, budget: int
) -> tuple[list[RowMapping], int]:
    """What a hint of a batched lane claims first: the hinted task (claimable as in ``claim_txn``)
    and the due members of its wake-up group (SKIP LOCKED: a row another claimer holds is left to
    it), as far as their costs fit ``budget`` — the hinted task, or the oldest member, always.
    Returns the claimed rows and how many due members were left out for lack of budget: they stay
    queued in the group, and a new hint naming ``task_id`` claims them (the hinted task itself is
    running by then). A group is otherwise claimed whole — it is at most its creator's batch size
    — so a claimer with a smaller ``n`` leaves no member behind with its hint spent. Empty when
    neither the task nor any member is claimable. Call ``lock_hinted_txn`` first, in the same
    transaction."""
    return _claim_within_budget_txn(
        conn,
        f"SELECT t.id, t.id = :id AS hinted, t.priority, t.available_at, {BATCH_COST[lane]} AS cost"
        " FROM tasks t JOIN images i ON i.id = t.image_id"
        " WHERE (t.id = :id OR (t.hint_group = :id AND t.status = 'queued')) AND t.lane = :lane"
        " AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts"
        " AND ((t.status = 'queued' AND t.available_at <= :now) OR (t.status = 'running' AND t.lease_expires_at < :now))"
        " FOR UPDATE OF t SKIP LOCKED",
        {"id": task_id, "lane": lane, "owner": owner}, now, lease_s, budget=budget, at_least_one=True,
    )


def lock_hinted_txn(conn: Connection, task_id: uuid.UUID, lane: str) -> None:
    """Wait for the hinted task if it is queued and someone holds it — above all a new task joining
    its wake-up group (``join_open_group_txn``): the claim's next statement (a new snapshot) then
    sees every member that joined, and a later joiner finds the task claimed and hints for itself.
    Holding nothing else yet, this wait cannot close a lock cycle."""
    conn.execute(
        sql("SELECT id FROM tasks WHERE id = :id AND lane = :lane AND status = 'queued' FOR NO KEY UPDATE"),
        {"id": task_id, "lane": lane},
    )


def join_open_group_txn(
    conn: Connection, scope_id: str, lane: str, resource_key: str, priority: int, k: int, size: int,
    now: datetime,
) -> uuid.UUID | None:
    """Join ``k`` new tasks to the newest open wake-up group of (scope, lane, resource key,
    priority): its named task still queued and never claimed (so its hint is still ahead), room
    for ``k`` more under ``size``. Returns the named task's id (the new tasks' ``hint_group``; they
    need no hint of their own) or None (hint them yourselves).

    Never waits: a group whose named task is locked (being claimed, or joined by another writer)
    is passed over. The lock taken here is held to commit, so a claim of that hint waits for the
    join to land (``lock_hinted_txn``).
    """
    return conn.execute(
        sql(
            "UPDATE tasks SET hint_members = hint_members + :k WHERE id = ("
            " SELECT id FROM tasks WHERE scope_id = :s AND lane = :lane AND resource_key = :rk AND priority = :p"
            " AND status = 'queued' AND hint_group IS NULL"
            " ORDER BY created_at DESC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED"
            ") AND status = 'queued' AND attempt_count = 0 AND NOT cancel_requested AND available_at <= :now"
            " AND hint_members + :k < :size RETURNING id"
        ),
        {"s": scope_id, "lane": lane, "rk": resource_key, "p": priority, "k": k, "size": size, "now": now},
    ).scalar()


def claim_group_members_txn(
    conn: Connection, task_id: uuid.UUID, lane: str, n: int, owner: str, now: datetime, lease_s: float
) -> list[RowMapping]:
    """Claim up to ``n`` due queued members of ``task_id``'s wake-up group (one scope and resource
    key by construction: see advance._wake_groups)."""
    return _claim_picked_txn(
        conn,
        f"SELECT id FROM tasks WHERE hint_group = :id AND status = 'queued' AND available_at <= :now AND {_CLAIMABLE}"
        " ORDER BY priority DESC, available_at LIMIT :n FOR UPDATE SKIP LOCKED",
        {"id": task_id, "lane": lane, "n": n, "owner": owner}, now, lease_s,
    )


def heartbeat_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, lease_s: float
) -> RowMapping | None:
    """Extend the lease (fenced). Returns (cancel_requested,) or None when fenced out."""
    return (
        conn.execute(
            sql(f"UPDATE tasks SET lease_expires_at = :exp, updated_at = :now WHERE {FENCE} RETURNING cancel_requested"),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "exp": now + timedelta(seconds=lease_s)},
        )
        .mappings()
        .first()
    )


def finish_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, *, status: str,
    error: dict | None = None, result: dict | None = None,
) -> RowMapping | None:
    """Terminal transition of the current execution; None = fencing rejection."""
    return (
        conn.execute(
            sql(
                f"UPDATE tasks SET status = :st, error = CAST(:err AS jsonb), result = CAST(:res AS jsonb),"
                f" completed_at = :now, updated_at = :now, lease_expires_at = NULL WHERE {FENCE}"
                " RETURNING id, scope_id, job_id, stage, lane, resource_key, attempt_count"
            ),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "st": status,
             "err": None if error is None else canonical_json(error),
             "res": None if result is None else canonical_json(result)},
        )
        .mappings()
        .first()
    )


def requeue_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, available_at: datetime, error: dict
) -> RowMapping | None:
    """Back to queued after a retryable error, due at ``available_at`` (backoff)."""
    return (
        conn.execute(
            sql(
                "UPDATE tasks SET status = 'queued', available_at = :at, error = CAST(:err AS jsonb),"
                " lease_owner = NULL, lease_expires_at = NULL, last_hint_at = NULL, updated_at = :now"
                f" WHERE {FENCE} RETURNING id, job_id, stage, lane, attempt_count"
            ),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "at": available_at, "err": canonical_json(error)},
        )
        .mappings()
        .first()
    )


def cancel_job_tasks_txn(conn: Connection, job_id: uuid.UUID, now: datetime, reason: str) -> list[uuid.UUID]:
    """Queued tasks of the job → cancelled; running ones get cancel_requested. Returns cancelled ids."""
    err = canonical_json({"code": reason, "message": f"job {reason}"})
    cancelled = list(
        conn.execute(
            sql(
                "UPDATE tasks SET status = 'cancelled', error = CAST(:err AS jsonb), completed_at = :now,"
                " updated_at = :now WHERE job_id = :j AND status = 'queued' RETURNING id"
            ),
            {"j": job_id, "now": now, "err": err},
        ).scalars()
    )
    conn.execute(
        sql(
            "UPDATE tasks SET cancel_requested = true, updated_at = :now WHERE job_id = :j AND status = 'running'"
        ),
        {"j": job_id, "now": now},
    )
    return cancelled


def clear_hint_txn(conn: Connection, task_id: uuid.UUID) -> None:
    """The hint naming ``task_id`` was spent without claiming it or (some of) its wake-up group:
    those still queued wait unhinted (see lanes.refused_txn).

    Rows another transaction holds are skipped, never waited for: that transaction is claiming,
    hinting or cancelling them, and waiting here (after the claim took its fairness row and
    slots) could close a lock cycle with it.
    """
    conn.execute(
        sql(
            "UPDATE tasks SET last_hint_at = NULL WHERE id IN (SELECT id FROM tasks WHERE"
            " (id = :id OR hint_group = :id) AND status = 'queued' FOR UPDATE SKIP LOCKED)"
        ),
        {"id": task_id},
    )


def mark_hinted_txn(conn: Connection, task_ids: list[uuid.UUID], now: datetime) -> None:
    conn.execute(sql("UPDATE tasks SET last_hint_at = :now WHERE id = ANY(:ids)"), {"ids": task_ids, "now": now})


_NEW_TASKS = (
    "r AS (SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, scope_id text, job_id uuid,"
    " stage text, lane text, resource_key text, payload jsonb, input_fingerprint text, dedupe_key text,"
    " image_id uuid, image_sha256 text, priority int, max_attempts int, grant_id uuid, hint_group uuid,"
    " hint_members int, mh text))"
)


def insert_and_link_many_txn(conn: Connection, rows: list[dict[str, Any]], now: datetime) -> dict[uuid.UUID, uuid.UUID]:
    """Fast path of advancing several jobs: create their tasks (each bound to its operation grant,
    if any), point their stages at them and move the jobs' current_stage — one statement.

    ``rows`` are task values (with the new ``id``, its ``hint_group`` or None, and ``hint_members``)
    plus ``mh`` (the metadata hash to set on a job that has none yet).
    Returns {job id: new task id}; a job missing from it has an identical active task already
    (dedupe — also against another row of the same call), and its grant is left unbound for the caller.
    """
    if not rows:
        return {}
    doc = json.dumps(rows, default=str)
    result = conn.execute(
        sql(
            "WITH " + _NEW_TASKS + ", t AS ("
            " INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint,"
            " dedupe_key, image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,"
            " grant_id, hint_group, hint_members, created_at, updated_at)"
            " SELECT id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint, dedupe_key,"
            " image_id, image_sha256, 'queued', priority, :now, max_attempts, :now, grant_id, hint_group,"
            " hint_members, :now, :now"
            " FROM r"
            " ORDER BY job_id"
            " ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING"
            " RETURNING id, job_id, stage, grant_id, input_fingerprint"
            "), g AS ("
            " UPDATE operation_grants og SET task_id = t.id, updated_at = :now FROM t"
            " WHERE og.id = t.grant_id AND og.id = ANY(:grant_ids)"
            "), s AS ("
            " UPDATE job_stages js SET status = 'queued', task_id = t.id, input_fingerprint = t.input_fingerprint,"
            " error = NULL, retry_at = NULL, updated_at = :now FROM t"
            " WHERE js.job_id = t.job_id AND js.job_id = ANY(:job_ids) AND js.stage = t.stage"
            "), j AS ("
            " UPDATE processing_jobs pj SET current_stage = t.stage, metadata_hash = coalesce(pj.metadata_hash, r.mh),"
            " updated_at = :now FROM t JOIN r ON r.id = t.id"
            " WHERE pj.id = t.job_id AND pj.id = ANY(:job_ids) AND pj.status IN ('queued', 'running')"
            ") SELECT job_id, id FROM t"
        ),
        {"rows": doc, "now": now, "job_ids": [r["job_id"] for r in rows],
         "grant_ids": [r["grant_id"] for r in rows if r.get("grant_id") is not None]},
    )
    return {job_id: task_id for job_id, task_id in result}


def finish_many_txn(conn: Connection, rows: list[dict[str, Any]], now: datetime) -> dict[uuid.UUID, list[uuid.UUID]]:
    """Fenced terminal transition of several tasks and of every stage waiting on each, in one statement.

    ``rows``: {id, owner, gen, st (task status), sst (stage status), err, res} — err/res dicts or None.
    Each row is fenced on its own. Returns {task id: job ids to advance} for the rows that landed;
    a task missing from it was fenced out.
    """
    if not rows:
        return {}
    doc = json.dumps([
        {**r, "err": None if r["err"] is None else canonical_json(r["err"]),
         "res": None if r["res"] is None else canonical_json(r["res"])}
        for r in rows
    ], default=str)
    result = conn.execute(
        sql(
            "WITH r AS (SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb))"
            "  AS r(id uuid, owner text, gen int, st text, sst text, err text, res text)"
            "), f AS ("
            " UPDATE tasks t SET status = r.st, error = CAST(r.err AS jsonb), result = CAST(r.res AS jsonb),"
            " completed_at = :now, updated_at = :now, lease_expires_at = NULL FROM r"
            " WHERE t.id = r.id AND t.id = ANY(:ids) AND t.lease_owner = r.owner AND t.claim_generation = r.gen"
            " AND t.status = 'running'"
            " RETURNING t.id, r.sst, r.err"
            "), s AS ("
            " UPDATE job_stages js SET status = f.sst, error = CAST(f.err AS jsonb), updated_at = :now,"
            " completed_at = CASE WHEN f.sst = 'succeeded' THEN CAST(:now AS timestamptz) ELSE js.completed_at END"
            " FROM f WHERE js.task_id = f.id AND js.status IN ('queued', 'running') RETURNING js.task_id, js.job_id"
            ") SELECT f.id, ARRAY(SELECT s.job_id FROM s WHERE s.task_id = f.id ORDER BY s.job_id) AS job_ids FROM f"
        ),
        {"rows": doc, "ids": [r["id"] for r in rows], "now": now},
    )
    return {task_id: list(job_ids) for task_id, job_ids in result}
