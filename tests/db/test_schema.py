"""The migrated schema: migrations round-trip, match the models, and enforce the invariants."""

from __future__ import annotations

import re
import uuid

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DataError, IntegrityError

from app.db import enums as E
from app.db.engine import alembic_config, ensure_vector_index
from app.db.models import Base

STATUS_CHECKS = {
    ("processing_jobs", "status"): E.JobStatus,
    ("processing_jobs", "mode"): E.JobMode,
    ("processing_jobs", "reverse_image_policy"): E.ReverseImagePolicy,
    ("job_stages", "status"): E.StageStatus,
    ("job_stages", "stage"): E.Stage,
    ("tasks", "status"): E.TaskStatus,
    ("tasks", "lane"): E.Lane,
    ("tasks", "stage"): E.Stage,
    ("task_attempts", "state"): E.AttemptState,
    ("operation_grants", "state"): E.GrantState,
    ("images", "context_status"): E.ContextStatus,
    ("batches", "status"): E.BatchStatus,
    ("batches", "reverse_image_policy"): E.ReverseImagePolicy,
    ("text_embeddings", "status"): E.TextEmbeddingStatus,
    ("lane_slots", "lane"): E.Lane,
    ("lane_fairness", "lane"): E.Lane,
    ("events", "type"): E.EventType,
    ("search_serving", "kind"): E.ServingKind,
    ("search_serving", "state"): E.ServingState,
    ("search_serving_events", "action"): E.ServingAction,
}


def _include(obj, name, type_, reflected, compare_to):
    return not (type_ == "index" and name and "_hnsw_" in name)


def test_upgrade_downgrade_upgrade_and_models_match(fresh_db):
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    eng = create_engine(url)
    with eng.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar()
    assert left == 1  # only alembic_version remains
    command.upgrade(cfg, "head")
    with eng.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"include_object": _include, "compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    eng.dispose()
    assert diff == []


def test_every_status_enum_equals_its_check_constraint(engine):
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT rel.relname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                "JOIN pg_class rel ON rel.oid = c.conrelid WHERE c.contype = 'c'"
            )
        ).all()
    for (table, column), enum in STATUS_CHECKS.items():
        defs = [d for t, d in rows if t == table and re.search(rf"\({column}\)?::text = ", d) and "vector_dims" not in d
                and "progress_open" not in d]
        assert len(defs) == 1, (table, column, defs)
        values = set(re.findall(r"'([^']+)'::", defs[0]))
        assert values == {m.value for m in enum}, (table, column)


@pytest.fixture()
def conn(engine):
    with engine.connect() as c:
        yield c


def _scope(conn, sid="s1"):
    conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:id, :ns)"), {"id": sid, "ns": uuid.uuid4()})
    conn.commit()
    return sid


def _image(conn, scope, sha=None):
    iid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key)"
            " VALUES (:id, :s, :sha, '.png', 'image/png', 10, 1, 1, 'k')"
        ),
        {"id": iid, "s": scope, "sha": sha or uuid.uuid4().hex * 2},
    )
    conn.commit()
    return iid


def _job(conn, scope, image, revision=1, status="queued"):
    jid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,"
            " reverse_image_policy, mode, status) VALUES (:id, :s, :i, :r, 'x', '{}', 'h', 'forbid', 'auto', :st)"
        ),
        {"id": jid, "s": scope, "i": image, "r": revision, "st": status},
    )
    conn.commit()
    return jid


def _task(conn, scope, job, image, dedupe="d1", status="queued"):
    conn.execute(
        text(
            "INSERT INTO tasks (scope_id, id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,"
            " image_sha256, status, max_attempts) VALUES (:s, :id, :j, 'visual', 'visual', '{}', 'f', :d, :i, 'x',"
            " :st, 3)"
        ),
        {"s": scope, "id": uuid.uuid4(), "j": job, "i": image, "d": dedupe, "st": status},
    )
    conn.commit()


def test_job_cannot_point_at_image_of_another_scope(conn):
    a, b = _scope(conn, "a"), _scope(conn, "b")
    img = _image(conn, a)
    with pytest.raises(IntegrityError, match="fk_processing_jobs"):
        _job(conn, b, img)


def test_task_cannot_point_at_job_of_another_scope(conn):
    a, b = _scope(conn, "a"), _scope(conn, "b")
    img_a, img_b = _image(conn, a), _image(conn, b)
    job = _job(conn, a, img_a)
    with pytest.raises(IntegrityError, match="fk_tasks"):
        _task(conn, b, job, img_b)


def test_two_active_jobs_for_one_image_rejected(conn):
    s = _scope(conn)
    img = _image(conn, s)
    _job(conn, s, img, 1, "running")
    _job(conn, s, img, 2, "failed")  # terminal jobs may coexist
    with pytest.raises(IntegrityError, match="uq_processing_jobs_one_active_per_image"):
        _job(conn, s, img, 3, "queued")


def test_two_active_tasks_with_one_dedupe_key_rejected(conn):
    s = _scope(conn)
    img = _image(conn, s)
    job = _job(conn, s, img)
    _task(conn, s, job, img, "k", "running")
    _task(conn, s, job, img, "k", "succeeded")
    with pytest.raises(IntegrityError, match="uq_tasks_active_dedupe"):
        _task(conn, s, job, img, "k", "queued")


def test_unknown_status_rejected(conn):
    s = _scope(conn)
    img = _image(conn, s)
    with pytest.raises(IntegrityError, match="ck_processing_jobs_status_valid"):
        _job(conn, s, img, status="sleeping")


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "tab\there", "x" * 129, "bell\x07"])
def test_invalid_scope_id_rejected(conn, bad):
    with pytest.raises((IntegrityError, DataError), match="ck_scopes_id_valid|too long"):
        _scope(conn, bad)


def test_valid_scope_ids_accepted(conn):
    for good in ["local", "tenant-42", "Team Ü", "x" * 128, "..."]:
        _scope(conn, good)


def test_vectors_of_two_dims_side_by_side_and_hnsw_index_used(conn):
    s = _scope(conn)
    images = [_image(conn, s) for _ in range(30)]
    for n, img in enumerate(images):
        for model, dims in (("small-model", 3), ("big-model", 5)):
            vec = [float((n * 7 + k) % 11) + 1.0 for k in range(dims)]
            conn.execute(
                text(
                    "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
                    " embedding) VALUES (:s, :i, 'x', :m, 'v1', :d, :v)"
                ),
                {"s": s, "i": img, "m": model, "d": dims, "v": str(vec)},
            )
    ensure_vector_index(conn, "visual_embeddings", "small-model", 3)
    ensure_vector_index(conn, "visual_embeddings", "big-model", 5)
    conn.commit()
    counts = conn.execute(text("SELECT dims, count(*) FROM visual_embeddings GROUP BY dims ORDER BY dims")).all()
    assert counts == [(3, 30), (5, 30)]
    with pytest.raises(IntegrityError, match="dims_match"):
        conn.execute(
            text(
                "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
                " embedding) VALUES (:s, :i, 'y', 'big-model', 'v1', 5, '[1,2,3]')"
            ),
            {"s": s, "i": images[0]},
        )
    conn.rollback()
    conn.execute(text("SET enable_seqscan = off"))
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            text(
                "EXPLAIN SELECT image_id FROM visual_embeddings WHERE model = 'big-model' AND dims = 5 "
                "ORDER BY embedding::vector(5) <=> '[1,2,3,4,5]'::vector(5) LIMIT 5"
            )
        )
    )
    assert "ix_visual_embeddings_hnsw_big_model_5" in plan, plan


def test_long_model_names_sharing_a_prefix_get_an_index_each(conn):
    from app.db.engine import vector_index_name

    a = "EVA02-E-14-plus-laion2b-s9b-b144k@0123456789abcdef"  # open_clip: architecture @ checkpoint hash
    b = "EVA02-E-14-plus-laion2b-s9b-b144k@fedcba9876543210"
    names = {vector_index_name("text_embeddings", m, 768) for m in (a, b)}
    assert len(names) == 2 and all(len(n) <= 63 for n in names)
    assert vector_index_name("visual_embeddings", "big-model", 5) == "ix_visual_embeddings_hnsw_big_model_5"
    created = {ensure_vector_index(conn, "visual_embeddings", m, 4) for m in (a, b)}
    conn.commit()
    found = {r[0] for r in conn.execute(text("SELECT indexname FROM pg_indexes WHERE indexname = ANY(:n)"),
                                        {"n": list(created)})}
    assert found == created and len(created) == 2


def _terms_after_upgrade(fresh_db, before: str, after: str, images: list[tuple[str, str, str, str]]) -> dict[str, str]:
    """Upgrade to ``before``, store ``images`` — (display name, context JSON, context status, the
    text of its stored terms) — as that schema's code left them, upgrade to ``after``; each image's
    terms by display name."""
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, before)
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('local', gen_random_uuid())"))
        for name, ctx, status, terms in images:
            conn.execute(text(
                "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height,"
                " storage_key, display_name, context, context_status, search_tsv) VALUES (gen_random_uuid(), 'local',"
                " md5(:n), '.png', 'image/png', 1, 1, 1, 'k' || :n, :n, CAST(:c AS jsonb), :st,"
                " to_tsvector('simple', :t))"), {"n": name, "c": ctx, "st": status, "t": terms})
    command.upgrade(cfg, after)
    with eng.connect() as conn:
        rows = dict(conn.execute(text("SELECT display_name, search_tsv::text FROM images")).all())
    eng.dispose()
    return rows


def test_0019_remakes_lexical_terms_with_traditional_chinese_folded(fresh_db):
    """Terms stored before the folding (traditional bigrams) are re-made from the current text."""
    ctx = '{"ocr_text": "躺平\\n是我最後的倔強", "title": "躺平", "tags": []}'
    rows = _terms_after_upgrade(fresh_db, "0013", "0019", [("a.png", ctx, "ready", "倔強 最後"),
                                                            ("b.png", ctx, "pending", "stale")])
    assert "'倔强'" in rows["a.png"] and "'最后'" in rows["a.png"] and "倔強" not in rows["a.png"]
    assert rows["b.png"] == "'b':1 'png':2"  # a pending context: the display name's terms only


def test_0024_remakes_lexical_terms_with_words_of_every_script(fresh_db):
    """Terms stored before (no term for a Cyrillic word or a Thai run) are re-made from the current text."""
    ctx = '{"ocr_text": "Кот СМЕЁТСЯ\\nแมวน่ารัก", "title": "", "tags": []}'
    stored = _terms_after_upgrade(fresh_db, "0023", "0024", [("a.png", ctx, "edited", "a png")])["a.png"]
    assert "'кот'" in stored and "'смеётся'" in stored and "'น่า'" in stored and "'png'" in stored, stored


def test_a_linked_job_and_a_claimed_stage_are_updated_in_place(conn):
    """0021: no index names a column these updates set, and the pages keep room, so both are HOT."""
    s = _scope(conn)
    job = _job(conn, s, _image(conn, s))
    conn.execute(text("INSERT INTO job_stages (job_id, stage, scope_id, position, status)"
                      " VALUES (:j, 'visual', :s, 0, 'queued')"), {"j": job, "s": s})
    conn.commit()
    conn.execute(text("UPDATE processing_jobs SET current_stage = 'agent', metadata_hash = 'm', updated_at = now()"
                      " WHERE id = :j"), {"j": job})
    conn.execute(text("UPDATE job_stages SET status = 'running', attempt_count = 1, started_at = now(),"
                      " updated_at = now() WHERE job_id = :j"), {"j": job})
    hot = dict(conn.execute(text(
        "SELECT relname, n_tup_hot_upd FROM pg_stat_xact_user_tables"
        " WHERE relname IN ('processing_jobs', 'job_stages')")).all())
    conn.rollback()
    assert hot == {"processing_jobs": 1, "job_stages": 1}
    options = dict(conn.execute(text(
        "SELECT relname, reloptions FROM pg_class WHERE relname IN ('processing_jobs', 'job_stages')")).all())
    assert options == {"processing_jobs": ["fillfactor=80"], "job_stages": ["fillfactor=80"]}


def test_0021_upgrades_a_library_with_jobs(fresh_db):
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, "0020")
    eng = create_engine(url)
    with eng.connect() as conn:
        s = _scope(conn)
        job = _job(conn, s, _image(conn, s), status="failed")
    command.upgrade(cfg, "0021")
    with eng.connect() as conn:
        got = conn.execute(text("SELECT id FROM processing_jobs")).scalars().all()
        indexes = set(conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'processing_jobs'"))
                      .scalars())
    eng.dispose()
    assert got == [job]
    assert "ix_processing_jobs_active" not in indexes and "ix_processing_jobs_needs_human" in indexes


def test_0028_gives_subscriptions_to_every_type_the_terminal_job_events(fresh_db):
    """A subscription created with the default (every type, stored as the list) keeps meaning every
    type; one that chose some types keeps its choice."""
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, "0027")
    eng = create_engine(url)
    old = ["job.succeeded", "job.failed", "job.blocked", "job.unknown_execution", "image.deleted",
           "batch.progress", "batch.completed", "batch.cancelled"]
    ins = text("INSERT INTO webhook_subscriptions (id, scope_id, url, event_types, secret)"
               " VALUES (:id, 's', 'http://x/', CAST(:t AS varchar(40)[]), 'k')")
    every, some = uuid.uuid4(), uuid.uuid4()
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('s', gen_random_uuid())"))
        conn.execute(ins, {"id": every, "t": old})
        conn.execute(ins, {"id": some, "t": ["job.failed"]})
    command.upgrade(cfg, "head")
    with eng.connect() as conn:
        got = dict(conn.execute(text("SELECT id, event_types FROM webhook_subscriptions")).all())
    assert set(got[every]) == {m.value for m in E.EventType} and got[some] == ["job.failed"]
    command.downgrade(cfg, "0027")
    with eng.connect() as conn:
        got = dict(conn.execute(text("SELECT id, event_types FROM webhook_subscriptions")).all())
    eng.dispose()
    assert got[every] == old and got[some] == ["job.failed"]


def test_0030_keeps_counters_of_before_under_no_scope(fresh_db):
    """Counters counted before they had a scope are kept, under ``''`` (shown on no scope's /ops);
    a scope's bucket of the same minute and name is a row of its own."""
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, "0029")
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO ops_counters (bucket, name, count) VALUES ('2026-12-07T10:00Z', 'rehint', 3)"))
    command.upgrade(cfg, "0030")
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO ops_counters (bucket, name, scope_id, count)"
                          " VALUES ('2026-12-07T10:00Z', 'rehint', 'alpha', 5)"))
        got = sorted(conn.execute(text("SELECT scope_id, count FROM ops_counters")).all())
    eng.dispose()
    assert got == [("", 3), ("alpha", 5)]


def test_0030_downgrade_folds_each_scope_s_counts_into_the_deployment_s(fresh_db):
    """Downgraded, a minute's counts are the deployment's again: every scope's bucket is added to
    the one of no scope (as 0029's code counted them), never dropped."""
    url = fresh_db(None)
    cfg = alembic_config(url)
    command.upgrade(cfg, "0030")
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO ops_counters (bucket, name, scope_id, count) VALUES"
                          " ('2026-12-07T10:00Z', 'rehint', '', 3), ('2026-12-07T10:00Z', 'rehint', 'alpha', 5),"
                          " ('2026-12-07T10:00Z', 'rehint', 'beta', 2),"
                          " ('2026-12-07T10:01Z', 'fencing_rejection', 'alpha', 1)"))
    command.downgrade(cfg, "0029")
    with eng.connect() as conn:
        got = sorted((str(r[0]), r[1], r[2]) for r in conn.execute(text("SELECT bucket, name, count FROM ops_counters")))
    eng.dispose()
    assert got == [("2026-12-07 10:00:00+00:00", "rehint", 10), ("2026-12-07 10:01:00+00:00", "fencing_rejection", 1)]
