"""Scopes and images: insert, lock, context and content changes, delete."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import IntegrityError

from app.db.enums import ContextStatus
from app.db.jsoncodec import dumps
from app.ids import new_id
from app.orchestrator.errors import DuplicateImage
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition
from app.search.lexical import image_terms

INSERT_SCOPE = sql("INSERT INTO scopes (id, storage_namespace) VALUES (:id, :ns) ON CONFLICT (id) DO NOTHING")

# The scope's storage namespace and its limit overrides (store/limits.py's SCOPE_LIMITS columns;
# ``has_limits``: an override row exists), in the statement an upload needs anyway.
SCOPE_FACTS = sql("""
SELECT s.storage_namespace, l.scope_id IS NOT NULL AS has_limits,
       l.max_bytes, l.max_images, l.uploads_per_minute, l.processing_per_minute
FROM scopes s LEFT JOIN scope_limits l ON l.scope_id = s.id WHERE s.id = :id
""")


def scope_facts_txn(conn: Connection, scope_id: str) -> RowMapping:
    """Create the scope if it has no row yet, and read its storage namespace and limit overrides
    (``has_limits`` false: none). An existing scope (the usual case) costs the one read; a new
    one is inserted (a concurrent creator's row wins the conflict) and read again."""
    row = conn.execute(SCOPE_FACTS, {"id": scope_id}).mappings().first()
    if row is None:
        conn.execute(INSERT_SCOPE, {"id": scope_id, "ns": uuid.uuid4()})
        row = conn.execute(SCOPE_FACTS, {"id": scope_id}).mappings().one()
    return row


def ensure_scope_txn(conn: Connection, scope_id: str) -> uuid.UUID:
    """Create the scope if it has no row yet; its storage namespace."""
    return scope_facts_txn(conn, scope_id)["storage_namespace"]


INSERT_IMAGE = sql("""
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,
                    display_name, metadata_hash, search_tsv, created_at, updated_at)
VALUES (:id, :scope, :sha256, :extension, :media_type, :size_bytes, :width, :height, :storage_key,
        :display_name, :metadata_hash, to_tsvector('simple', :terms), :now, :now)
ON CONFLICT (scope_id, sha256) DO NOTHING RETURNING *
""")


@transition
def insert_image_txn(conn: Connection, scope_id: str, values: dict[str, Any], now: datetime) -> Outcome[RowMapping]:
    """— → a new image (context pending). Not matched: the scope already has these bytes
    (unique (scope, sha256))."""
    return Outcome.of(conn.execute(INSERT_IMAGE, {
        "id": new_id(), "scope": scope_id, "now": now, "terms": image_terms(values.get("display_name"), None),
        **values,
    }).mappings().all())


LOCK_IMAGE = sql("SELECT * FROM images WHERE scope_id = :s AND id = :id FOR UPDATE")
LOCK_IMAGE_SHARE = sql("SELECT * FROM images WHERE scope_id = :s AND id = :id FOR SHARE")


def lock_image_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, *, share: bool = False) -> RowMapping | None:
    """Lock (``share``: FOR SHARE) and read one image of the scope; None when there is none."""
    return conn.execute(LOCK_IMAGE_SHARE if share else LOCK_IMAGE, {"s": scope_id, "id": image_id}).mappings().first()


# ix_tasks_image (scope_id, image_id); a task a worker is finishing waits here, and one it
# finished meanwhile no longer matches (EvalPlanQual re-checks the status)
LOCK_OPEN_TASKS_OF_IMAGE = sql("""
SELECT id FROM tasks WHERE scope_id = :s AND image_id = :i AND status IN ('queued', 'running') ORDER BY id FOR UPDATE
""")


def lock_open_tasks_of_image_txn(conn: Connection, scope_id: str, image_id: uuid.UUID) -> None:
    """Lock the image's queued and running tasks, in id order, before its active job is locked
    to be ended (delete, content replace, context edit, cancel). A claim and a worker's failure lock a
    task and then its job; taking the job first and then waiting for one of its tasks closed a
    lock cycle that PostgreSQL broke by aborting one side (a 500, or a lost failure)."""
    conn.execute(LOCK_OPEN_TASKS_OF_IMAGE, {"s": scope_id, "i": image_id})


# What a completion needs of its images (target check, planning facts, the metadata hash's
# inputs) — not the context document itself, which can be large and is not read there.
LOCK_IMAGES = sql("""
SELECT id, scope_id, sha256, storage_key, display_name, context_status, context_provenance, metadata_hash, revision
FROM images WHERE id = ANY(:ids) ORDER BY id FOR UPDATE
""")
LOCK_IMAGES_SHARE = sql("""
SELECT id, scope_id, sha256, storage_key, display_name, context_status, context_provenance, metadata_hash, revision
FROM images WHERE id = ANY(:ids) ORDER BY id FOR SHARE
""")


def lock_images_txn(conn: Connection, image_ids: list[uuid.UUID], *, share: bool = False) -> dict[uuid.UUID, RowMapping]:
    """Lock several images in id order (the order every multi-image writer uses); their facts by id."""
    rows = conn.execute(LOCK_IMAGES_SHARE if share else LOCK_IMAGES, {"ids": list(image_ids)}).mappings()
    return {r["id"]: r for r in rows}


def image_by_sha_txn(conn: Connection, scope_id: str, sha256: str) -> RowMapping | None:
    return (
        conn.execute(
            sql("SELECT * FROM images WHERE scope_id = :s AND sha256 = :sha FOR UPDATE"), {"s": scope_id, "sha": sha256}
        )
        .mappings()
        .first()
    )


WRITE_AGENT_CONTEXTS = sql("""
UPDATE images i SET context = r.ctx, context_status = 'ready', context_provenance = r.prov,
       metadata_hash = r.mh, revision = i.revision + 1, search_tsv = to_tsvector('simple', r.terms), updated_at = :now
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, sha text, ctx jsonb, prov jsonb, mh text, terms text)
WHERE i.id = r.id AND i.id = ANY(:ids) AND i.sha256 = r.sha
RETURNING i.id, i.scope_id, i.sha256, i.storage_key, i.display_name, i.context_status, i.context_provenance,
          i.metadata_hash, i.revision
""")


@transition
def write_agent_contexts_txn(conn: Connection, rows: list[dict], now: datetime) -> Outcome[RowMapping]:
    """context → ready (+ provenance, metadata_hash, lexical terms), each image only if it still has the bytes described.

    One statement. ``rows``: id, sha, context, provenance, metadata_hash, display_name (the locked
    image's, which the metadata hash covered too). ``rows`` of the outcome: the updated images'
    facts (as ``lock_images_txn``); an image missing from them changed its bytes.
    """
    if not rows:
        return Outcome(False)
    # the context and provenance go in as the document's own values (jsonb columns of the
    # recordset): one encoding, one parse, the same jsonb as a cast of their canonical text
    doc = dumps([{"id": str(r["id"]), "sha": r["sha"], "ctx": r["context"], "prov": r["provenance"],
                  "mh": r["metadata_hash"], "terms": image_terms(r["display_name"], r["context"])} for r in rows])
    return Outcome.of(conn.execute(WRITE_AGENT_CONTEXTS, {"rows": doc, "ids": [r["id"] for r in rows],
                                                          "now": now}).mappings().all())


EDIT_CONTEXT = sql("""
UPDATE images SET display_name = :dn, context = CAST(:ctx AS jsonb), context_status = :cs,
       context_provenance = CAST(:prov AS jsonb), metadata_hash = :mh, revision = revision + 1,
       search_tsv = to_tsvector('simple', :terms), updated_at = :now
WHERE id = :id RETURNING *
""")


@transition
def edit_context_txn(
    conn: Connection, image_id: uuid.UUID, *, display_name: str | None, context: dict | None,
    context_status: str, provenance: dict | None, metadata_hash: str, now: datetime,
) -> Outcome[RowMapping]:
    """context → ``context_status`` (a human edit: ``edited``), name and metadata_hash with it.

    The caller holds the image row locked (``lock_image_txn``), so the row is the from-state."""
    return Outcome.of(conn.execute(EDIT_CONTEXT, {
        "terms": image_terms(display_name, context if context_status in (ContextStatus.READY, ContextStatus.EDITED)
                             else None),
        "dn": display_name, "ctx": None if context is None else canonical_json(context),
        "cs": context_status, "prov": None if provenance is None else canonical_json(provenance),
        "mh": metadata_hash, "now": now, "id": image_id,
    }).mappings().all())


DISPLAY_NAME = sql("SELECT display_name FROM images WHERE id = :id")

# New bytes: the context no longer describes them (back to pending) and lexical search keeps only
# the display name — unless a human wrote the context (edited).
REPLACE_CONTENT = sql("""
UPDATE images SET sha256 = :sha256, extension = :extension, media_type = :media_type, size_bytes = :size_bytes,
       width = :width, height = :height, storage_key = :storage_key,
       search_tsv = CASE WHEN context_status = 'edited' THEN search_tsv ELSE to_tsvector('simple', :name_terms) END,
       context_status = CASE WHEN context_status = 'edited' THEN 'edited' ELSE 'pending' END,
       revision = revision + 1, updated_at = :now
WHERE id = :id RETURNING *
""")


@transition
def replace_content_txn(
    conn: Connection, image_id: uuid.UUID, values: dict[str, Any], now: datetime
) -> Outcome[RowMapping]:
    """bytes → new bytes, context → pending (unless ``edited``). The caller holds the row locked.

    ``DuplicateImage`` when another image of the scope already has those bytes."""
    name = conn.execute(DISPLAY_NAME, {"id": image_id}).scalar()
    try:
        return Outcome.of(conn.execute(REPLACE_CONTENT, {
            "id": image_id, "now": now, "name_terms": image_terms(name, None), **values,
        }).mappings().all())
    except IntegrityError as exc:
        if getattr(getattr(exc.orig, "diag", None), "constraint_name", None) == "uq_images_scope_id_sha256":
            raise DuplicateImage(
                "another image of this scope already has these bytes", image_id=str(image_id)
            ) from None
        raise


DELETE_IMAGE = sql("DELETE FROM images WHERE scope_id = :s AND id = :id RETURNING storage_key")


@transition
def delete_image_txn(conn: Connection, scope_id: str, image_id: uuid.UUID) -> Outcome[str]:
    """image → deleted; jobs, stages, tasks, attempts and embeddings cascade. ``row``: its storage
    key. Not matched: no such image in the scope."""
    return Outcome.of(conn.execute(DELETE_IMAGE, {"s": scope_id, "id": image_id}).scalars().all())


# Whether an image row references a file. A content-addressed key (app/storage.py) is
# ``<namespace>/<sha256><ext>``, and a row's key is always its own scope's namespace and its own
# sha256: so the rows that can reference it are found through the scopes' unique namespace and the
# images' unique (scope_id, sha256) — an index probe, not a scan of every image (there is no index
# on storage_key, and these checks run on every delete, replace, failed upload and gc candidate).
# A key of another shape (none is written today) falls back to comparing storage_key alone.
STORAGE_KEY_IN_USE = sql("""
SELECT EXISTS (SELECT 1 FROM images i
               WHERE i.scope_id = (SELECT s.id FROM scopes s WHERE s.storage_namespace = CAST(:ns AS uuid))
                 AND i.sha256 = :sha AND i.storage_key = :k)
""")
STORAGE_KEY_IN_USE_ANY_SHAPE = sql("SELECT EXISTS (SELECT 1 FROM images WHERE storage_key = :k)")
REFERENCED_STORAGE_KEYS = sql("""
SELECT i.storage_key
FROM unnest(CAST(:ns AS uuid[]), CAST(:sha AS text[]), CAST(:keys AS text[])) AS k(ns, sha, key)
CROSS JOIN LATERAL (
  SELECT i.storage_key FROM images i
  WHERE i.scope_id = (SELECT s.id FROM scopes s WHERE s.storage_namespace = k.ns)
    AND i.sha256 = k.sha AND i.storage_key = k.key) i
""")
_CONTENT_KEY = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/([0-9a-f]{64})\.[a-z0-9]{1,6}$")


def storage_key_in_use_txn(conn: Connection, storage_key: str) -> bool:
    """Whether any image row (any scope) references the file. Read under ``lock_storage_key_txn``
    (a statement after the lock sees every row committed before it was granted)."""
    m = _CONTENT_KEY.match(storage_key)
    if m is None:
        return conn.execute(STORAGE_KEY_IN_USE_ANY_SHAPE, {"k": storage_key}).scalar_one()
    return conn.execute(STORAGE_KEY_IN_USE, {"ns": m.group(1), "sha": m.group(2), "k": storage_key}).scalar_one()


def lock_storage_key_txn(conn: Connection, storage_key: str) -> None:
    """Serialise everything that decides whether a stored file exists, held to the end of the
    transaction: an upload holds it from its file check (or write) until its row commits, a file
    removal from its reference check until the file is gone. Keyed by the storage key."""
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"file:{storage_key}"})


def storage_namespaces_txn(conn: Connection) -> set[str]:
    """The storage namespaces of this database's scopes: the only directories of the storage root
    whose files its rows can say anything about."""
    return {str(ns) for ns in conn.execute(sql("SELECT storage_namespace FROM scopes")).scalars()}


def referenced_storage_keys_txn(conn: Connection, storage_keys: list[str]) -> set[str]:
    """Which of ``storage_keys`` an image row (any scope) references."""
    parsed = [(m.group(1), m.group(2), key) for key in storage_keys if (m := _CONTENT_KEY.match(key))]
    odd = [key for key in storage_keys if not _CONTENT_KEY.match(key)]
    found: set[str] = set()
    if parsed:
        ns, sha, keys = (list(col) for col in zip(*parsed, strict=True))
        found |= set(conn.execute(REFERENCED_STORAGE_KEYS, {"ns": ns, "sha": sha, "keys": keys}).scalars())
    if odd:
        found |= set(conn.execute(sql("SELECT storage_key FROM images WHERE storage_key = ANY(:keys)"),
                                  {"keys": odd}).scalars())
    return found
