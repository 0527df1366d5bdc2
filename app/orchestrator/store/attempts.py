"""Agent attempts (SPEC §4.5): a row committed in external_started before any paid call."""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection, RowMapping

from app.db.jsoncodec import dumps
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition


def open_attempt_txn(conn: Connection, task_id: uuid.UUID) -> RowMapping | None:
    """The latest attempt still in external_started (an execution that never finished)."""
    return (
        conn.execute(
            sql(
                "SELECT * FROM task_attempts WHERE task_id = :t AND state = 'external_started'"
                " ORDER BY attempt_no DESC LIMIT 1 FOR UPDATE"
            ),
            {"t": task_id},
        )
        .mappings()
        .first()
    )


START_ATTEMPTS = sql("""
INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state, input_digest,
                           target_sha256, recall_safe, created_at, updated_at)
SELECT r.a, r.s, r.t, coalesce((SELECT max(x.attempt_no) FROM task_attempts x WHERE x.task_id = r.t), 0) + 1, r.g,
       'external_started', r.d, r.sha, r.rs, :now, :now
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(a text, s text, t uuid, g bigint, d text, sha text, rs boolean)
""")


def new_attempt_ids(n: int) -> list[str]:
    """``n`` unguessable attempt ids, drawn by the claimer before its transaction: a claimer whose
    COMMIT reply was lost finds its own attempts by them (``resume_started_txn``)."""
    return [secrets.token_hex(16) for _ in range(n)]


@transition
def start_attempts_txn(conn: Connection, rows: list[dict], ids: list[str], now: datetime) -> list[str]:
    """— → external_started, one attempt per claimed agent task, committed before any paid call.

    ``rows``: scope_id, task_id, generation, input_digest, target_sha256, recall_safe (the claiming
    worker's provider: ``app.stages.base.is_recall_safe``); each takes the next of ``ids``
    (``new_attempt_ids``, at least one per row). Returns the ids used, in order (an insert cannot
    be "not matched").
    """
    assert len(ids) >= len(rows), "an attempt id per started attempt"
    ids = ids[: len(rows)]
    if rows:
        conn.execute(START_ATTEMPTS, {"rows": dumps([
            {"a": a, "s": r["scope_id"], "t": str(r["task_id"]), "g": r["generation"], "d": r["input_digest"],
             "sha": r["target_sha256"], "rs": bool(r.get("recall_safe", False))} for a, r in zip(ids, rows, strict=True)
        ]), "now": now})
    return ids


RESUME_STARTED = sql("""
WITH mine AS (
  SELECT t.id, a.attempt_id, a.recall_safe
  FROM task_attempts a
  JOIN tasks t ON t.id = a.task_id AND t.claim_generation = a.claim_generation
  WHERE a.attempt_id = ANY(:ids) AND a.state = 'external_started'
    AND t.status = 'running' AND t.lease_owner = :owner AND t.lease_expires_at > :now
  FOR UPDATE OF t
)
UPDATE tasks t SET lease_expires_at = :until, updated_at = :now
FROM mine, images i
WHERE t.id = mine.id AND i.id = t.image_id
RETURNING t.id, t.scope_id, t.job_id, t.image_id, t.image_sha256, t.stage, t.lane, t.claim_generation,
          t.attempt_count, t.max_attempts, t.payload, t.grant_id, i.storage_key, mine.attempt_id, mine.recall_safe
""")


@transition
def resume_started_txn(
    conn: Connection, attempt_ids: list[str], owner: str, now: datetime, lease_s: float,
) -> Outcome[RowMapping]:
    """running (``owner``'s, lease live, same generation as one of ``attempt_ids``, still
    external_started: its paid call not yet made) → running with a fresh lease: the claim whose
    COMMIT reply was lost, taken back by the worker that made it. Renewed in the same statement
    that finds it, so the time lost to the broken connection cannot let the lease lapse before the
    call (another worker's recovery would then end it ``unknown_execution``). Rows: the claim
    row's columns plus ``attempt_id``. Not matched: nothing of the first try committed, or the
    claim is no longer this worker's."""
    return Outcome.of(list(conn.execute(RESUME_STARTED, {
        "ids": list(attempt_ids), "owner": owner, "now": now, "until": now + timedelta(seconds=lease_s),
    }).mappings()))


NOTE_ATTEMPT_ERROR = sql("""
UPDATE task_attempts SET error = CAST(:err AS jsonb), updated_at = :now
WHERE attempt_id = :a AND task_id = :t AND state = 'external_started'
""")


@transition
def note_attempt_error_txn(conn: Connection, attempt_id: str, task_id: uuid.UUID, now: datetime,
                           error: dict) -> Outcome[None]:
    """external_started → external_started, ``error`` set: why its worker is about to end (the
    watchdog's ``stage_timeout``); the recovery decides its state as after any death. Not matched:
    the attempt was closed already."""
    return Outcome.count(conn.execute(NOTE_ATTEMPT_ERROR, {
        "a": attempt_id, "t": task_id, "now": now, "err": canonical_json(error),
    }).rowcount)


FINISH_ATTEMPT = sql("""
UPDATE task_attempts SET state = :st, result = CAST(:res AS jsonb), error = CAST(:err AS jsonb),
       provider_request_id = coalesce(:rid, provider_request_id), updated_at = :now
WHERE attempt_id = :a AND task_id = :t AND state = 'external_started'
""")


@transition
def finish_attempt_txn(
    conn: Connection, attempt_id: str, task_id: uuid.UUID, state: str, now: datetime, *,
    result: dict | None = None, error: dict | None = None, request_id: str | None = None,
) -> Outcome[None]:
    """external_started → completed / failed / unknown_execution. Not matched: the attempt was closed already."""
    return Outcome.count(conn.execute(FINISH_ATTEMPT, {
        "a": attempt_id, "t": task_id, "st": state, "now": now, "rid": request_id,
        "res": None if result is None else canonical_json(result),
        "err": None if error is None else canonical_json(error),
    }).rowcount)


COMPLETE_ATTEMPTS = sql("""
UPDATE task_attempts a SET state = 'completed', result = r.res,
       provider_request_id = coalesce(r.rid, a.provider_request_id), updated_at = :now
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(a text, t uuid, res jsonb, rid text)
WHERE a.attempt_id = r.a AND a.attempt_id = ANY(:ids) AND a.task_id = r.t AND a.state = 'external_started'
""")


@transition
def complete_many_txn(conn: Connection, rows: list[dict], now: datetime) -> Outcome[None]:
    """external_started → completed, several attempts in one statement (rows: attempt_id, task_id, result, request_id)."""
    if not rows:
        return Outcome(False)
    return Outcome.count(conn.execute(COMPLETE_ATTEMPTS, {
        "rows": dumps([{"a": r["attempt_id"], "t": str(r["task_id"]), "res": r["result"],
                        "rid": r["request_id"]} for r in rows]),
        "ids": [r["attempt_id"] for r in rows], "now": now,
    }).rowcount)


def open_attempt_ids_txn(conn: Connection, attempt_ids: list[str]) -> set[str]:
    """Those of ``attempt_ids`` still in flight (prepared or external_started): an execution may
    yet adopt them, so their local result records must stay."""
    return set(
        conn.execute(
            sql("SELECT attempt_id FROM task_attempts WHERE attempt_id = ANY(:ids)"
                " AND state IN ('prepared', 'external_started')"),
            {"ids": list(attempt_ids)},
        ).scalars()
    )


# A batch's paid outcomes closed in one statement (issue 21): complete_many_txn's attempts,
# grants.commit_grants_txn's grants and slots.release_many_txn's slots, each UPDATE with its own
# condition, on the statement's one snapshot (three tables, no row written twice).
CLOSE_PAID = sql("""
WITH done AS (
  UPDATE task_attempts a SET state = 'completed', result = r.res,
         provider_request_id = coalesce(r.rid, a.provider_request_id), updated_at = :now
  FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(a text, t uuid, res jsonb, rid text)
  WHERE a.attempt_id = r.a AND a.attempt_id = ANY(:ids) AND a.task_id = r.t AND a.state = 'external_started'
  RETURNING 1
), paid AS (
  UPDATE operation_grants SET state = 'committed', updated_at = :now
  WHERE id = ANY(CAST(:grants AS uuid[])) AND state = 'acquired'
  RETURNING 1
), freed AS (
  UPDATE lane_slots s SET task_id = NULL, claim_generation = NULL, lease_expires_at = NULL, updated_at = :now
  FROM unnest(CAST(:tasks AS uuid[]), CAST(:gens AS bigint[])) AS h(t, gen)
  WHERE s.task_id = h.t AND s.task_id = ANY(CAST(:tasks AS uuid[])) AND s.claim_generation = h.gen
  RETURNING 1
)
SELECT (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM paid) AS committed,
       (SELECT count(*) FROM freed) AS released
""")


@transition
def close_paid_many_txn(
    conn: Connection, rows: list[dict], grant_ids: list[uuid.UUID], holders: list[tuple[uuid.UUID, int]],
    now: datetime,
) -> Outcome[RowMapping]:
    """external_started → completed (``rows`` as complete_many_txn), acquired → committed (the
    built-in policies' grants) and held → free (the slots of ``holders``: task id, generation), one
    statement. ``row``: how many of each changed; matched when an attempt was completed."""
    row = conn.execute(CLOSE_PAID, {
        "rows": dumps([{"a": r["attempt_id"], "t": str(r["task_id"]), "res": r["result"],
                        "rid": r["request_id"]} for r in rows]),
        "ids": [r["attempt_id"] for r in rows], "grants": list(grant_ids),
        "tasks": [t for t, _ in holders], "gens": [g for _, g in holders], "now": now,
    }).mappings().one()
    return Outcome(row["completed"] > 0, (row,), int(row["completed"]))
