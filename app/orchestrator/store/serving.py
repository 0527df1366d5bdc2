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

from app.orchestrator.store._sql import sql

# A current embedding of model ({m}, {d}[, preprocess version {p}]) for image ``i`` (its bytes — and
# for text its context — as they are now), per kind.
_CURRENT = {
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
#: Images a model change waits for: text needs a context (images without one have no text yet); visual
#: waits for images whose agent stage is done too, so a fill job never re-runs (pays for) a failed or
#: unfinished agent — such an image gets the new vector from its own job (which embeds with both).
_NEEDS = {"text": "i.metadata_hash IS NOT NULL", "visual": "i.context_status <> 'pending'"}

#: Validity of the text stage (app/orchestrator/planner.py) during a model change: besides the job's own
#: model, an image needs a current embedding of its scope's serving and target text models, so uploads
#: and context edits in a backfill are embedded with both (format with scope, image, sha, mh).
SERVING_TEXT_MISSING = (
    "EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims),"
    " (ss.target_model, ss.target_dims)) AS w(model, dims) WHERE ss.scope_id = {scope} AND ss.kind = 'text'"
    " AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM text_embeddings x2 WHERE x2.scope_id = {scope}"
    " AND x2.image_id = {image} AND x2.image_sha256 = {sha} AND x2.metadata_hash = {mh} AND x2.status = 'ready'"
    " AND x2.model = w.model AND x2.dims = w.dims))"
)

#: The same for the visual stage (format with scope, image, sha): the scope's serving and target visual
#: models, each with its preprocess version.
SERVING_VISUAL_MISSING = (
    "EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims,"
    " ss.serving_ref->>'preprocess_version'), (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version'))"
    " AS w(model, dims, pv) WHERE ss.scope_id = {scope} AND ss.kind = 'visual' AND w.model IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM visual_embeddings v2 WHERE v2.scope_id = {scope} AND v2.image_id = {image}"
    " AND v2.image_sha256 = {sha} AND v2.model = w.model AND v2.preprocess_version = w.pv AND v2.dims = w.dims))"
)

#: Retention hook (alias ``te`` for text_embeddings). A row is *superseded by a model change* —
#: prunable — when its model is none of its scope's serving, target or previous model; the previous
#: one is kept for a rollback until :keep_after passed its switch (and always while the scope is
#: pinned: after a rollback it is the configured model, still written). Scopes without a serving row
#: are left alone (nothing is known about them yet). Rows of old image versions are another matter
#: (their model may be current): this predicate says nothing about them.
PRUNABLE_MODEL_PREDICATE = (
    "EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = te.scope_id AND ss.kind = 'text'"
    " AND te.model IS DISTINCT FROM ss.serving_model AND te.model IS DISTINCT FROM ss.target_model"
    " AND (te.model IS DISTINCT FROM ss.previous_model"
    "  OR (ss.state <> 'pinned' AND ss.switched_at < :keep_after)))"
)


def ref_json(ref: dict[str, Any] | None) -> str | None:
    return None if ref is None else json.dumps(ref, sort_keys=True)


def serving_txn(conn: Connection, scope_id: str, kind: str, *, lock: bool = False) -> RowMapping | None:
    statement = "SELECT * FROM search_serving WHERE scope_id = :s AND kind = :k" + (" FOR UPDATE" if lock else "")
    return conn.execute(sql(statement), {"s": scope_id, "k": kind}).mappings().first()


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


def bootstrap_txn(conn: Connection, scope_id: str, kind: str, ref: dict[str, Any], now: datetime) -> bool:
    """Create the scope's row served by ``ref``; False when it already exists (a concurrent bootstrap)."""
    row = conn.execute(
        sql(
            "INSERT INTO search_serving (scope_id, kind, state, epoch, serving_model, serving_dims, serving_ref,"
            " updated_at) VALUES (:s, :k, 'serving', 0, :m, :d, CAST(:ref AS jsonb), :now)"
            " ON CONFLICT (scope_id, kind) DO NOTHING RETURNING epoch"
        ),
        {"s": scope_id, "k": kind, "m": ref["model"], "d": int(ref["dims"]), "ref": ref_json(ref), "now": now},
    ).first()
    return row is not None


def needing_attention_txn(
    conn: Connection, kind: str, model: str, dims: int, limit: int, preprocess_version: str | None = None
) -> list[RowMapping]:
    """Rows the sweep must act on: in backfill, or served by a model other than the configured one
    (and not pinned by an operator)."""
    return list(conn.execute(
        sql(
            "SELECT * FROM search_serving WHERE kind = :k AND (state = 'backfill'"
            " OR (state = 'serving' AND (serving_model <> :m OR serving_dims <> :d"
            "  OR coalesce(serving_ref->>'preprocess_version', '') <> coalesce(CAST(:p AS text), ''))))"
            " ORDER BY updated_at LIMIT :n"
        ),
        {"k": kind, "m": model, "d": int(dims), "p": preprocess_version, "n": limit},
    ).mappings())


def begin_backfill_txn(
    conn: Connection, scope_id: str, kind: str, target: dict[str, Any], *, from_model: str, now: datetime
) -> RowMapping | None:
    """serving → backfill towards ``target``, only if still served by ``from_model`` and not pinned."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET state = 'backfill', target_model = :m, target_dims = :d,"
            " target_ref = CAST(:ref AS jsonb), batch_id = NULL, fill_rounds = 0, ready = 0, total = 0,"
            " coverage_at = NULL, checked_at = NULL, started_at = :now, updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'serving' AND serving_model = :from_"
            " RETURNING *"
        ),
        {"s": scope_id, "k": kind, "m": target["model"], "d": int(target["dims"]), "ref": ref_json(target),
         "from_": from_model, "now": now},
    ).mappings().first()


def retarget_txn(
    conn: Connection, scope_id: str, kind: str, target: dict[str, Any], *, from_target: str, now: datetime
) -> RowMapping | None:
    """backfill towards ``from_target`` → backfill towards ``target`` (the configuration changed again)."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET target_model = :m, target_dims = :d, target_ref = CAST(:ref AS jsonb),"
            " batch_id = NULL, fill_rounds = 0, ready = 0, total = 0, coverage_at = NULL, checked_at = NULL,"
            " started_at = :now, updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :from_ RETURNING *"
        ),
        {"s": scope_id, "k": kind, "m": target["model"], "d": int(target["dims"]), "ref": ref_json(target),
         "from_": from_target, "now": now},
    ).mappings().first()


def end_backfill_txn(
    conn: Connection, scope_id: str, kind: str, *, state: str, from_target: str | None, now: datetime
) -> RowMapping | None:
    """backfill → ``state`` (serving or pinned) without switching the reads (abort)."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET state = :st, target_model = NULL, target_dims = NULL, target_ref = NULL,"
            " batch_id = NULL, checked_at = NULL, updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'backfill'"
            " AND (CAST(:from_ AS text) IS NULL OR target_model = :from_) RETURNING *"
        ),
        {"s": scope_id, "k": kind, "st": state, "from_": from_target, "now": now},
    ).mappings().first()


def set_batch_txn(conn: Connection, scope_id: str, kind: str, batch_id: uuid.UUID, *, target: str,
                  now: datetime) -> bool:
    """Attach a fill batch to the backfill towards ``target`` (another round counts one more)."""
    res = conn.execute(
        sql(
            "UPDATE search_serving SET batch_id = :b, fill_rounds = fill_rounds + 1, updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :t"
        ),
        {"s": scope_id, "k": kind, "b": batch_id, "t": target, "now": now},
    )
    return res.rowcount > 0


def claim_check_txn(conn: Connection, scope_id: str, kind: str, now: datetime, min_interval_s: float) -> RowMapping | None:
    """Take the right to run the (whole-scope) coverage check now: at most one process per
    ``min_interval_s`` per scope, so racing completions do not each scan the scope."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET checked_at = :now WHERE scope_id = :s AND kind = :k AND state = 'backfill'"
            " AND (checked_at IS NULL OR checked_at <= :now - make_interval(secs => :iv)) RETURNING *"
        ),
        {"s": scope_id, "k": kind, "now": now, "iv": float(min_interval_s)},
    ).mappings().first()


def cutover_txn(
    conn: Connection, scope_id: str, *, target: str, target_dims: int, early: bool, now: datetime,
    kind: str = "text", target_pv: str | None = None,
) -> RowMapping | None:
    """Switch the scope's reads of ``kind`` to ``target`` in one statement, epoch + 1 — only while
    the scope is still in backfill towards ``target`` and (unless ``early``) every image that needs
    one (text: has a context) has a current embedding of it. Racing callers: exactly one matches."""
    covered = (f"NOT EXISTS (SELECT 1 FROM images i WHERE i.scope_id = :s AND {_NEEDS[kind]} AND NOT "
               + _CURRENT[kind].format(m=":t", d=":td", p=":tp") + ")")
    return conn.execute(
        sql(
            "UPDATE search_serving SET previous_model = serving_model, previous_dims = serving_dims,"
            " previous_ref = serving_ref, serving_model = target_model, serving_dims = target_dims,"
            " serving_ref = target_ref, target_model = NULL, target_dims = NULL, target_ref = NULL,"
            " state = 'serving', epoch = epoch + 1, batch_id = NULL, switched_at = :now, updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'backfill' AND target_model = :t AND target_dims = :td"
            " AND coalesce(target_ref->>'preprocess_version', '') = coalesce(CAST(:tp AS text), '')"
            f" AND (:early OR {covered}) RETURNING *"
        ),
        {"s": scope_id, "k": kind, "t": target, "td": int(target_dims), "tp": target_pv, "early": bool(early),
         "now": now},
    ).mappings().first()


def rollback_txn(conn: Connection, scope_id: str, kind: str, *, epoch: int, now: datetime) -> RowMapping | None:
    """Serve the previous model again (serving and previous swap), epoch + 1, pinned — only at ``epoch``."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET serving_model = previous_model, serving_dims = previous_dims,"
            " serving_ref = previous_ref, previous_model = serving_model, previous_dims = serving_dims,"
            " previous_ref = serving_ref, state = 'pinned', epoch = epoch + 1, switched_at = :now,"
            " updated_at = :now WHERE scope_id = :s AND kind = :k AND state IN ('serving', 'pinned')"
            " AND previous_model IS NOT NULL AND epoch = :e RETURNING *"
        ),
        {"s": scope_id, "k": kind, "e": epoch, "now": now},
    ).mappings().first()


def resume_txn(conn: Connection, scope_id: str, kind: str, now: datetime) -> RowMapping | None:
    """pinned → serving: the sweep may start a backfill towards the configured model again."""
    return conn.execute(
        sql(
            "UPDATE search_serving SET state = 'serving', updated_at = :now"
            " WHERE scope_id = :s AND kind = :k AND state = 'pinned' RETURNING *"
        ),
        {"s": scope_id, "k": kind, "now": now},
    ).mappings().first()


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


def coverage_txn(
    conn: Connection, scope_id: str, kind: str, model: str, dims: int, preprocess_version: str | None = None
) -> dict[str, int]:
    """{ready, total}: the scope's images that need an embedding of the kind (text: those with a
    context), and those of them with a current embedding of the model."""
    row = conn.execute(
        sql(
            "SELECT count(*) AS total, count(*) FILTER (WHERE "
            + _CURRENT[kind].format(m=":m", d=":d", p=":p") + ") AS ready"
            f" FROM images i WHERE i.scope_id = :s AND {_NEEDS[kind]}"
        ),
        {"s": scope_id, "m": model, "d": int(dims), "p": preprocess_version},
    ).one()
    return {"ready": int(row.ready), "total": int(row.total)}


def text_coverage_txn(conn: Connection, scope_id: str, model: str, dims: int) -> dict[str, int]:
    """:func:`coverage_txn` of a text model."""
    return coverage_txn(conn, scope_id, "text", model, dims)


def _missing_any(kind: str) -> str:
    """The image lacks a current embedding of one of the fill models (``:models``)."""
    return ("EXISTS (SELECT 1 FROM jsonb_to_recordset(CAST(:models AS jsonb)) AS fm(model text, dims int, pv text)"
            " WHERE NOT " + _CURRENT[kind].format(m="fm.model", d="fm.dims", p="fm.pv") + ")")


def fill_kind(models: list[dict[str, Any]]) -> str:
    """The kind of a fill batch's models (one kind per batch; entries without one are text)."""
    return str(models[0].get("kind", "text")) if models else "text"


def count_needing_fill_txn(conn: Connection, scope_id: str, models: list[dict[str, Any]], until: datetime) -> int:
    kind = fill_kind(models)
    return conn.execute(
        sql(f"SELECT count(*) FROM images i WHERE i.scope_id = :s AND i.created_at <= :u AND {_NEEDS[kind]}"
            f" AND {_missing_any(kind)}"),
        {"s": scope_id, "u": until, "models": _models_doc(models)},
    ).scalar_one()


def fill_page_txn(
    conn: Connection, scope_id: str, models: list[dict[str, Any]], until: datetime,
    after: tuple[datetime, uuid.UUID] | None, n: int,
) -> tuple[list[RowMapping], tuple[datetime, uuid.UUID] | None]:
    """The next images (keyset over (created_at, id), up to ``n`` scanned) lacking a current
    embedding of one of ``models``, each with the reverse_image_policy its context was made with;
    and the keyset position reached (None: the scan is done)."""
    kind = fill_kind(models)
    rows = conn.execute(
        sql(
            "SELECT i.id, i.created_at, coalesce(i.context_provenance->>'reverse_image_policy', 'forbid') AS policy,"
            f" ({_NEEDS[kind]} AND {_missing_any(kind)}) AS needs FROM images i WHERE i.scope_id = :s"
            " AND i.created_at <= :u AND (CAST(:ac AS timestamptz) IS NULL OR (i.created_at, i.id) > (:ac, :aid))"
            " ORDER BY i.created_at, i.id LIMIT :n"
        ),
        {"s": scope_id, "u": until, "ac": after[0] if after else None, "aid": after[1] if after else None,
         "n": n, "models": _models_doc(models)},
    ).mappings().all()
    position = (rows[-1]["created_at"], rows[-1]["id"]) if len(rows) == n else None
    return [r for r in rows if r["needs"]], position


def _models_doc(models: list[dict[str, Any]]) -> str:
    return json.dumps([{"model": m["model"], "dims": int(m["dims"]), "pv": m.get("preprocess_version")}
                       for m in models])


def prunable_text_embeddings_txn(conn: Connection, keep_after: datetime, limit: int) -> list[int]:
    """Ids of up to ``limit`` text embeddings superseded by a model change (PRUNABLE_MODEL_PREDICATE),
    locked ``SKIP LOCKED`` for the caller's delete — the hook the retention sweep uses."""
    return list(conn.execute(
        sql(f"SELECT te.id FROM text_embeddings te WHERE {PRUNABLE_MODEL_PREDICATE}"
            " ORDER BY te.id LIMIT :n FOR UPDATE OF te SKIP LOCKED"),
        {"keep_after": keep_after, "n": limit},
    ).scalars())


def current_text_models_many_txn(conn: Connection, image_ids: list[uuid.UUID]) -> dict[uuid.UUID, set[tuple[str, int]]]:
    """(model, dims) of every current text embedding of each image (its bytes and context as now)."""
    rows = conn.execute(
        sql(
            "SELECT i.id, t.model, t.dims FROM images i JOIN text_embeddings t ON t.scope_id = i.scope_id"
            " AND t.image_id = i.id AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash"
            " AND t.status = 'ready' WHERE i.id = ANY(:ids)"
        ),
        {"ids": list(image_ids)},
    ).all()
    out: dict[uuid.UUID, set[tuple[str, int]]] = {}
    for image_id, model, dims in rows:
        out.setdefault(image_id, set()).add((model, int(dims)))
    return out


def current_visual_models_many_txn(
    conn: Connection, image_ids: list[uuid.UUID]
) -> dict[uuid.UUID, set[tuple[str, int, str]]]:
    """(model, dims, preprocess_version) of every current visual embedding of each image."""
    rows = conn.execute(
        sql(
            "SELECT i.id, v.model, v.dims, v.preprocess_version FROM images i JOIN visual_embeddings v"
            " ON v.scope_id = i.scope_id AND v.image_id = i.id AND v.image_sha256 = i.sha256 WHERE i.id = ANY(:ids)"
        ),
        {"ids": list(image_ids)},
    ).all()
    out: dict[uuid.UUID, set[tuple[str, int, str]]] = {}
    for image_id, model, dims, pv in rows:
        out.setdefault(image_id, set()).add((model, int(dims), pv))
    return out


#: Visual retention hook (alias ``ve`` for visual_embeddings), as PRUNABLE_MODEL_PREDICATE.
PRUNABLE_VISUAL_MODEL_PREDICATE = (
    "EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = ve.scope_id AND ss.kind = 'visual'"
    " AND (ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM"
    "  (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version')"
    " AND (ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM"
    "  (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')"
    " AND ((ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM"
    "  (ss.previous_model, ss.previous_dims, ss.previous_ref->>'preprocess_version')"
    "  OR (ss.state <> 'pinned' AND ss.switched_at < :keep_after)))"
)


def prunable_visual_embeddings_txn(conn: Connection, keep_after: datetime, limit: int) -> list[tuple]:
    """Keys (scope_id, image_id, model, preprocess_version, image_sha256) of up to ``limit`` visual
    embeddings superseded by a model change, locked SKIP LOCKED for the caller's DELETE."""
    return [tuple(r) for r in conn.execute(
        sql(f"SELECT ve.scope_id, ve.image_id, ve.model, ve.preprocess_version, ve.image_sha256"
            f" FROM visual_embeddings ve WHERE {PRUNABLE_VISUAL_MODEL_PREDICATE}"
            " LIMIT :n FOR UPDATE OF ve SKIP LOCKED"),
        {"keep_after": keep_after, "n": limit},
    )]
