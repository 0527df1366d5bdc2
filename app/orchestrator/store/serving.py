"""Search serving state (migration 0017): every statement that reads or switches which model a
scope's search reads. Each switch is one conditional UPDATE that says whether it happened.

A *model ref* is ``{"spec", "options", "model", "dims", "config"}``: the provider spec and options
that rebuild the model in any process, and the identity its embeddings are stored under.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import Outcome, sql, transition

# A current embedding of model ({m}, {d}[, preprocess version {p}]) for image ``i`` (its bytes — and
# for text its context — as they are now), per kind. The statements spell it out (COVERAGE_*,
# CUTOVER_*, serving_fill's fill scans); tests/unit/test_transition_table.py checks they agree.
CURRENT = {
    "text": (
        "EXISTS (SELECT 1 FROM text_embeddings t WHERE t.scope_id = i.scope_id AND t.image_id = i.id"
        " AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash AND t.status = 'ready'"
        " AND t.model = {m} AND t.dims = {d})"
    ),
    "visual": (
        "EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = i.scope_id AND v.image_id = i.id"
        " AND v.image_sha256 = i.sha256 AND v.model = {m} AND v.dims = {d} AND v.preprocess_version = {p})"
    ),
}
#: Images a model change waits for: text needs a context of the image's current bytes (images without
#: one have no text yet; after a content replace the old ``metadata_hash`` stays while the context is
#: ``pending`` — until the new bytes' agent lands, or for good when it failed or ended
#: ``unknown_execution``: a fill job for such an image would call the paid agent again, which a model
#: change never does, and its own job embeds the new model once its agent lands).
#: Visual needs a visual vector of the image's bytes (of any model: what look-alike search finds today
#: — an image that never got one, its bytes undecodable, is not waited for) and, so that a fill job
#: never re-runs (pays for) a failed agent, a context of its bytes (an edit of replaced bytes is not) or an
#: active job: an image whose agent is still
#: under way is searchable by the serving model, and its own job re-plans its visual stage once the
#: agent lands (the stage is valid only with the target too), so the cutover waits for it rather
#: than drop it from look-alike search. An image whose job ended without a context (its agent
#: failed) keeps only the old vector until it is retried (docs/operations.md).
NEEDS = {
    "text": (
        "(i.metadata_hash IS NOT NULL AND i.context_status <> 'pending'"
        " AND i.context_provenance->>'image_sha256' = i.sha256)"
    ),
    "visual": (
        "(EXISTS (SELECT 1 FROM visual_embeddings va WHERE va.scope_id = i.scope_id AND va.image_id = i.id"
        " AND va.image_sha256 = i.sha256) AND ((i.context_status <> 'pending'"
        " AND i.context_provenance->>'image_sha256' = i.sha256) OR EXISTS (SELECT 1 FROM"
        " processing_jobs ja WHERE ja.image_id = i.id AND ja.status IN ('queued', 'running'))))"
    ),
}


def ref_json(ref: dict[str, Any] | None) -> str | None:
    return None if ref is None else json.dumps(ref, sort_keys=True)


SERVING = sql("SELECT * FROM search_serving WHERE scope_id = :s AND kind = :k")
LOCK_SERVING = sql("SELECT * FROM search_serving WHERE scope_id = :s AND kind = :k FOR UPDATE")


def serving_txn(conn: Connection, scope_id: str, kind: str, *, lock: bool = False) -> RowMapping | None:
    """A scope's serving state of ``kind`` (``lock``: locked until the transaction ends), or None."""
    return conn.execute(LOCK_SERVING if lock else SERVING, {"s": scope_id, "k": kind}).mappings().first()


def serving_many_txn(conn: Connection, scope_ids: list[str], kind: str) -> dict[str, RowMapping]:
    rows = conn.execute(
        sql("SELECT * FROM search_serving WHERE scope_id = ANY(:s) AND kind = :k"), {"s": list(scope_ids), "k": kind}
    ).mappings()
    return {r["scope_id"]: r for r in rows}


def all_serving_txn(conn: Connection, scope_id: str | None = None) -> list[RowMapping]:
    return list(conn.execute(
        sql("SELECT * FROM search_serving WHERE (CAST(:s AS text) IS NULL OR scope_id = :s) ORDER BY scope_id, kind"),
        {"s": scope_id},
    ).mappings())


def scopes_without_serving_txn(conn: Connection, kind: str, limit: int) -> list[str]:
    return list(conn.execute(
        sql(
            "SELECT s.id FROM scopes s WHERE NOT EXISTS (SELECT 1 FROM search_serving ss"
            " WHERE ss.scope_id = s.id AND ss.kind = :k) ORDER BY s.id LIMIT :n"
        ),
        {"k": kind, "n": limit},
    ).scalars())


BOOTSTRAP = sql("""
INSERT INTO search_serving (scope_id, kind, state, epoch, serving_model, serving_dims, serving_ref, updated_at)
VALUES (:s, :k, 'serving', 0, :m, :d, CAST(:ref AS jsonb), :now)
ON CONFLICT (scope_id, kind) DO NOTHING
RETURNING epoch
""")


@transition
def bootstrap_txn(conn: Connection, scope_id: str, kind: str, ref: dict[str, Any], now: datetime) -> Outcome[int]:
    """— → serving ``ref``, epoch 0. Not matched: the row exists already (a concurrent bootstrap)."""
    return Outcome.of(conn.execute(BOOTSTRAP, {
        "s": scope_id, "k": kind, "m": ref["model"], "d": int(ref["dims"]), "ref": ref_json(ref), "now": now,
    }).scalars().all())


BEGIN_BACKFILL = sql("""
UPDATE search_serving SET state = 'backfill', target_model = :m, target_dims = :d, target_ref = CAST(:ref AS jsonb),
       batch_id = NULL, fill_rounds = 0, ready = 0, total = 0, coverage_at = NULL, checked_at = NULL,
       started_at = :now, updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'serving' AND serving_model = :from_
RETURNING *
""")


@transition
def begin_backfill_txn(
    conn: Connection, scope_id: str, kind: str, target: dict[str, Any], *, from_model: str, now: datetime
) -> Outcome[RowMapping]:
    """serving → backfill towards ``target``, only if still served by ``from_model`` and not pinned."""
    return Outcome.of(conn.execute(BEGIN_BACKFILL, {
        "s": scope_id, "k": kind, "m": target["model"], "d": int(target["dims"]), "ref": ref_json(target),
        "from_": from_model, "now": now,
    }).mappings().all())


RETARGET = sql("""
UPDATE search_serving SET target_model = :m, target_dims = :d, target_ref = CAST(:ref AS jsonb), batch_id = NULL,
       fill_rounds = 0, ready = 0, total = 0, coverage_at = NULL, checked_at = NULL, started_at = :now,
       updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :from_
RETURNING *
""")


@transition
def retarget_txn(
    conn: Connection, scope_id: str, kind: str, target: dict[str, Any], *, from_target: str, now: datetime
) -> Outcome[RowMapping]:
    """backfill towards ``from_target`` → backfill towards ``target`` (the configuration changed again)."""
    return Outcome.of(conn.execute(RETARGET, {
        "s": scope_id, "k": kind, "m": target["model"], "d": int(target["dims"]), "ref": ref_json(target),
        "from_": from_target, "now": now,
    }).mappings().all())


END_BACKFILL = sql("""
UPDATE search_serving SET state = :st, target_model = NULL, target_dims = NULL, target_ref = NULL, batch_id = NULL,
       checked_at = NULL, updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND CAST(:st AS text) IN ('serving', 'pinned')
  AND (CAST(:from_ AS text) IS NULL OR target_model = :from_)
RETURNING *
""")


@transition
def end_backfill_txn(
    conn: Connection, scope_id: str, kind: str, *, state: str, from_target: str | None, now: datetime
) -> Outcome[RowMapping]:
    """backfill → serving / pinned without switching the reads (abort)."""
    return Outcome.of(conn.execute(END_BACKFILL, {
        "s": scope_id, "k": kind, "st": state, "from_": from_target, "now": now,
    }).mappings().all())


SET_FILL_BATCH = sql("""
UPDATE search_serving SET batch_id = :b, fill_rounds = fill_rounds + 1, updated_at = :now
WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :t
""")


@transition
def set_batch_txn(conn: Connection, scope_id: str, kind: str, batch_id: uuid.UUID, *, target: str,
                  now: datetime) -> Outcome[None]:
    """backfill → backfill with a fill batch attached (another round counts one more)."""
    return Outcome.count(conn.execute(SET_FILL_BATCH, {
        "s": scope_id, "k": kind, "b": batch_id, "t": target, "now": now,
    }).rowcount)


CLAIM_CHECK = sql("""
UPDATE search_serving ss SET checked_at = :now
WHERE scope_id = :s AND kind = :k AND state = 'backfill'
  AND (checked_at IS NULL OR checked_at <= :now - make_interval(secs => :iv))
  AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = ss.batch_id AND b.status = 'seeding')
RETURNING *
""")


@transition
def claim_check_txn(conn: Connection, scope_id: str, kind: str, now: datetime,
                    min_interval_s: float) -> Outcome[RowMapping]:
    """backfill → backfill, checked now: the right to run the (whole-scope) coverage check.

    At most one process per ``min_interval_s`` per scope, so racing completions do not each scan
    the scope; and not while the scope's fill batch is still seeding (some images are not even
    queued yet).
    """
    return Outcome.of(conn.execute(CLAIM_CHECK, {
        "s": scope_id, "k": kind, "now": now, "iv": float(min_interval_s),
    }).mappings().all())


# The cutover, one statement per kind (CURRENT/NEEDS spelled out): the NOT EXISTS stops at the
# first image that needs the target and lacks a current embedding of it.
CUTOVER_TEXT = sql("""
UPDATE search_serving SET previous_model = serving_model, previous_dims = serving_dims, previous_ref = serving_ref,
       serving_model = target_model, serving_dims = target_dims, serving_ref = target_ref, target_model = NULL,
       target_dims = NULL, target_ref = NULL, state = 'serving', epoch = epoch + 1, batch_id = NULL,
       switched_at = :now, updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :t AND target_dims = :td
  AND coalesce(target_ref->>'preprocess_version', '') = coalesce(CAST(:tp AS text), '')
  AND (:early OR NOT EXISTS (
    SELECT 1 FROM images i WHERE i.scope_id = :s AND (i.metadata_hash IS NOT NULL AND i.context_status <> 'pending'
      AND i.context_provenance->>'image_sha256' = i.sha256)
      AND NOT EXISTS (SELECT 1 FROM text_embeddings t WHERE t.scope_id = i.scope_id AND t.image_id = i.id
                      AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash AND t.status = 'ready'
                      AND t.model = :t AND t.dims = :td)))
RETURNING *
""")

CUTOVER_VISUAL = sql("""
UPDATE search_serving SET previous_model = serving_model, previous_dims = serving_dims, previous_ref = serving_ref,
       serving_model = target_model, serving_dims = target_dims, serving_ref = target_ref, target_model = NULL,
       target_dims = NULL, target_ref = NULL, state = 'serving', epoch = epoch + 1, batch_id = NULL,
       switched_at = :now, updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :t AND target_dims = :td
  AND coalesce(target_ref->>'preprocess_version', '') = coalesce(CAST(:tp AS text), '')
  AND (:early OR NOT EXISTS (
    SELECT 1 FROM images i WHERE i.scope_id = :s
      AND (EXISTS (SELECT 1 FROM visual_embeddings va WHERE va.scope_id = i.scope_id AND va.image_id = i.id
                        AND va.image_sha256 = i.sha256)
               AND ((i.context_status <> 'pending' AND i.context_provenance->>'image_sha256' = i.sha256)
                OR EXISTS (SELECT 1 FROM processing_jobs ja WHERE ja.image_id = i.id
                                                            AND ja.status IN ('queued', 'running'))))
      AND NOT EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = i.scope_id AND v.image_id = i.id
                      AND v.image_sha256 = i.sha256 AND v.model = :t AND v.dims = :td
                      AND v.preprocess_version = :tp)))
RETURNING *
""")


@transition
def cutover_txn(
    conn: Connection, scope_id: str, *, target: str, target_dims: int, early: bool, now: datetime,
    kind: str = "text", target_pv: str | None = None,
) -> Outcome[RowMapping]:
    """backfill → serving ``target``, epoch + 1: switch the scope's reads of ``kind`` in one statement.

    Only while the scope is still in backfill towards ``target`` and (unless ``early``) every
    image that needs one (text: has a context) has a current embedding of it. Racing callers:
    exactly one matches.
    """
    return Outcome.of(conn.execute(CUTOVER_VISUAL if kind == "visual" else CUTOVER_TEXT, {
        "s": scope_id, "k": kind, "t": target, "td": int(target_dims), "tp": target_pv, "early": bool(early),
        "now": now,
    }).mappings().all())


ROLLBACK = sql("""
UPDATE search_serving SET serving_model = previous_model, serving_dims = previous_dims, serving_ref = previous_ref,
       previous_model = serving_model, previous_dims = serving_dims, previous_ref = serving_ref, state = 'pinned',
       epoch = epoch + 1, switched_at = :now, updated_at = :now, config_disagree_since = NULL, config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state IN ('serving', 'pinned') AND previous_model IS NOT NULL AND epoch = :e
  AND (CAST(:kept_since AS timestamptz) IS NULL OR switched_at >= :kept_since)
RETURNING *
""")


@transition
def rollback_txn(conn: Connection, scope_id: str, kind: str, *, epoch: int, now: datetime,
                 kept_since: datetime | None = None) -> Outcome[RowMapping]:
    """serving / pinned → pinned, serving and previous swapped, epoch + 1 — only at ``epoch`` and,
    given ``kept_since`` (old-model retention on: the rollback window's start), only if the switch
    was no earlier: before it, retention may have pruned the previous model's rows."""
    return Outcome.of(conn.execute(ROLLBACK, {
        "s": scope_id, "k": kind, "e": epoch, "now": now, "kept_since": kept_since,
    }).mappings().all())


RESUME = sql("""
UPDATE search_serving SET state = 'serving', updated_at = :now, config_disagree_since = NULL,
       config_disagree_ref = NULL
WHERE scope_id = :s AND kind = :k AND state = 'pinned'
RETURNING *
""")


@transition
def resume_txn(conn: Connection, scope_id: str, kind: str, now: datetime) -> Outcome[RowMapping]:
    """pinned → serving: the sweep may start a backfill towards the configured model again."""
    return Outcome.of(conn.execute(RESUME, {"s": scope_id, "k": kind, "now": now}).mappings().all())


def set_coverage_txn(conn: Connection, scope_id: str, kind: str, ready: int, total: int, now: datetime) -> None:
    conn.execute(
        sql(
            "UPDATE search_serving SET ready = :r, total = :t, coverage_at = :now"
            " WHERE scope_id = :s AND kind = :k"
        ),
        {"s": scope_id, "k": kind, "r": int(ready), "t": int(total), "now": now},
    )


def record_event_txn(
    conn: Connection, scope_id: str, kind: str, action: str, epoch: int, *, from_model: str | None,
    to_model: str | None, now: datetime, detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        sql(
            "INSERT INTO search_serving_events (scope_id, kind, action, epoch, from_model, to_model, detail, at)"
            " VALUES (:s, :k, :a, :e, :f, :t, CAST(:detail AS jsonb), :now)"
        ),
        {"s": scope_id, "k": kind, "a": action, "e": epoch, "f": from_model, "t": to_model,
         "detail": None if detail is None else json.dumps(detail, sort_keys=True), "now": now},
    )


def events_txn(conn: Connection, scope_id: str, kind: str, limit: int) -> list[RowMapping]:
    return list(conn.execute(
        sql(
            "SELECT action, epoch, from_model, to_model, detail, at FROM search_serving_events"
            " WHERE scope_id = :s AND kind = :k ORDER BY id DESC LIMIT :n"
        ),
        {"s": scope_id, "k": kind, "n": limit},
    ).mappings())


# Coverage of a model per kind: the scope's images that need an embedding of the kind (NEEDS), and
# those of them with a current one of model (:m, :d[, :p]) — CURRENT spelled out.
COVERAGE_TEXT = sql("""
SELECT count(*) AS total,
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM text_embeddings t WHERE t.scope_id = i.scope_id
                                      AND t.image_id = i.id AND t.image_sha256 = i.sha256
                                      AND t.metadata_hash = i.metadata_hash AND t.status = 'ready'
                                      AND t.model = :m AND t.dims = :d)) AS ready
FROM images i WHERE i.scope_id = :s AND (i.metadata_hash IS NOT NULL AND i.context_status <> 'pending'
  AND i.context_provenance->>'image_sha256' = i.sha256)
""")

COVERAGE_VISUAL = sql("""
SELECT count(*) AS total,
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = i.scope_id
                                      AND v.image_id = i.id AND v.image_sha256 = i.sha256
                                      AND v.model = :m AND v.dims = :d AND v.preprocess_version = :p)) AS ready
FROM images i WHERE i.scope_id = :s
  AND (EXISTS (SELECT 1 FROM visual_embeddings va WHERE va.scope_id = i.scope_id AND va.image_id = i.id
                    AND va.image_sha256 = i.sha256)
           AND ((i.context_status <> 'pending' AND i.context_provenance->>'image_sha256' = i.sha256)
                OR EXISTS (SELECT 1 FROM processing_jobs ja WHERE ja.image_id = i.id
                                                        AND ja.status IN ('queued', 'running'))))
""")
COVERAGE = {"text": COVERAGE_TEXT, "visual": COVERAGE_VISUAL}


def coverage_txn(
    conn: Connection, scope_id: str, kind: str, model: str, dims: int, preprocess_version: str | None = None
) -> dict[str, int]:
    """{ready, total}: the scope's images that need an embedding of the kind (text: those with a
    context), and those of them with a current embedding of the model."""
    row = conn.execute(
        COVERAGE[kind], {"s": scope_id, "m": model, "d": int(dims), "p": preprocess_version},
    ).one()
    return {"ready": int(row.ready), "total": int(row.total)}


def text_coverage_txn(conn: Connection, scope_id: str, model: str, dims: int) -> dict[str, int]:
    """:func:`coverage_txn` of a text model."""
    return coverage_txn(conn, scope_id, "text", model, dims)


