"""Retention in the sweep: old history goes, in bounded batches, through indexes; what a live
job, a job awaiting a human or the current artifact needs stays (app/orchestrator/retention.py)."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, retention
from tests.support.pipeline import png_bytes, store_and_ingest

DAY = 86400.0
# no time budget: these tests count what one sweep deletes (the budget has its own test)
AGES = dict(retention_jobs_s=30 * DAY, retention_tasks_s=7 * DAY, retention_attempts_s=7 * DAY,
            retention_embeddings_s=DAY, retention_ops_counters_s=7 * DAY, retention_budget_ms=0.0)
KINDS = ("jobs", "tasks", "attempts", "grants", "batch_items", "batches", "text_embeddings", "visual_embeddings",
         "ops_counters")


def _image(conn, sha: str, mh: str = "m2") -> uuid.UUID:
    return conn.execute(text(
        "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
        " metadata_hash) VALUES (gen_random_uuid(), 'local', :sha, '.png', 'image/png', 1, 1, 1, 'k', :mh) RETURNING id"),
        {"sha": sha, "mh": mh}).scalar_one()


def _job(conn, image: uuid.UUID, rev: int, status: str, days: float, batch: uuid.UUID | None = None) -> uuid.UUID:
    return conn.execute(text(
        "INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,"
        " reverse_image_policy, mode, status, batch_id, completed_at, updated_at)"
        " SELECT gen_random_uuid(), 'local', :i, :r, sha256, '{}', 'h', 'forbid', 'auto', CAST(:st AS text), CAST(:b AS uuid),"
        " CASE WHEN CAST(:st AS text) IN ('queued', 'running') THEN NULL ELSE now() - make_interval(secs => :age) END,"
        " now() - make_interval(secs => :age) FROM images WHERE id = :i RETURNING id"),
        {"i": image, "r": rev, "st": status, "b": batch, "age": days * DAY}).scalar_one()


def _task(conn, job: uuid.UUID, status: str, days: float, *, stage_ref: bool = False) -> uuid.UUID:
    task = conn.execute(text(
        "INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,"
        " image_sha256, status, max_attempts, completed_at, updated_at)"
        " SELECT gen_random_uuid(), scope_id, id, 'visual', 'visual', '{}', 'f', md5(random()::text), image_id,"
        " image_sha256, CAST(:st AS text), 3, CASE WHEN CAST(:st AS text) IN ('queued', 'running') THEN NULL"
        " ELSE now() - make_interval(secs => :age) END, now()"
        " FROM processing_jobs WHERE id = :j RETURNING id"), {"j": job, "st": status, "age": days * DAY}).scalar_one()
    if stage_ref:
        conn.execute(text(
            "INSERT INTO job_stages (job_id, stage, scope_id, position, status, task_id)"
            " VALUES (:j, 'visual', 'local', 0, 'succeeded', :t)"), {"j": job, "t": task})
    return task


def _attempt(conn, task: uuid.UUID, no: int, state: str, days: float) -> str:
    attempt_id = f"a-{task}-{no}"
    conn.execute(text(
        "INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state,"
        " input_digest, target_sha256, updated_at) VALUES (:a, 'local', :t, :n, 1, :st, 'd', 's',"
        " now() - make_interval(secs => :age))"), {"a": attempt_id, "t": task, "n": no, "st": state, "age": days * DAY})
    return attempt_id


def _text(conn, image: uuid.UUID, mh: str, model: str, days: float) -> int:
    return conn.execute(text(
        "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,"
        " document, embedding, created_at) SELECT 'local', id, sha256, :mh, :m, 3, '1', '', '[1,0,0]',"
        " now() - make_interval(secs => :age) FROM images WHERE id = :i RETURNING id"),
        {"i": image, "mh": mh, "m": model, "age": days * DAY}).scalar_one()


def _visual(conn, image: uuid.UUID, sha: str | None, model: str, pv: str, days: float) -> int:
    return conn.execute(text(
        "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims, embedding,"
        " created_at) SELECT 'local', id, coalesce(:sha, sha256), :m, :p, 3, '[1,0,0]',"
        " now() - make_interval(secs => :age) FROM images WHERE id = :i RETURNING id"),
        {"i": image, "sha": sha, "m": model, "p": pv, "age": days * DAY}).scalar_one()


def _ids(conn, table: str, col: str = "id") -> set:
    return set(conn.execute(text(f"SELECT {col} FROM {table}")).scalars())


def test_old_history_goes_and_everything_protected_stays(engine, settings):
    orch = Orchestrator(engine, settings.replace(**AGES))
    live = store_and_ingest(orch, "local", png_bytes(1))  # an active job with its queued task
    cfg = orch.stage_configs
    text_model = str(cfg.text["model"])
    vis_model, vis_pv = str(cfg.visual["model"]), str(cfg.visual["preprocess_version"])
    with engine.begin() as conn:
        live_job = uuid.UUID(str(live.job["id"]))
        live_image = conn.execute(text("SELECT image_id FROM processing_jobs WHERE id = :j"), {"j": live_job}).scalar()
        conn.execute(text("UPDATE processing_jobs SET revision = 50 WHERE id = :j"), {"j": live_job})
        old_of_live = _task(conn, live_job, "succeeded", 40)  # a live job's earlier task: kept
        replaced_by_live = _job(conn, live_image, 1, "superseded", 40)  # ... but its replaced jobs go
        img = _image(conn, "b" * 64)
        batch = conn.execute(text(
            "INSERT INTO batches (id, scope_id, status, select_all, reverse_image_policy)"
            " VALUES (gen_random_uuid(), 'local', 'running', true, 'forbid') RETURNING id")).scalar_one()
        keep_jobs = {
            "latest": _job(conn, img, 10, "succeeded", 40),
            "recent": _job(conn, img, 2, "superseded", 1),
            "blocked": _job(conn, img, 3, "blocked", 40),
            "unknown": _job(conn, img, 4, "unknown_execution", 40),
            "running_task": _job(conn, img, 5, "superseded", 40),
            "batch": _job(conn, img, 6, "superseded", 40, batch=batch),
        }
        drop_jobs = {"superseded": _job(conn, img, 1, "superseded", 40), "failed": _job(conn, img, 7, "failed", 40)}
        dropped_task = _task(conn, drop_jobs["superseded"], "succeeded", 40, stage_ref=True)
        dropped_attempt = _attempt(conn, dropped_task, 1, "completed", 40)
        keep_tasks = {
            "stage_ref": _task(conn, keep_jobs["latest"], "succeeded", 40, stage_ref=True),
            "recent": _task(conn, keep_jobs["latest"], "succeeded", 1),
            "blocked": _task(conn, keep_jobs["blocked"], "failed", 40),
            "unknown": _task(conn, keep_jobs["unknown"], "failed", 40),
            "running": _task(conn, keep_jobs["running_task"], "running", 40),
            "old_of_live": old_of_live,
        }
        drop_tasks = {"unreferenced": _task(conn, keep_jobs["latest"], "succeeded", 40)}
        ref = keep_tasks["stage_ref"]
        keep_attempts = {
            _attempt(conn, ref, 2, "external_started", 40), _attempt(conn, ref, 3, "unknown_execution", 40),
            _attempt(conn, ref, 4, "completed", 1), _attempt(conn, keep_tasks["unknown"], 1, "completed", 40),
            _attempt(conn, keep_tasks["blocked"], 1, "failed", 40),
        }
        drop_attempts = {_attempt(conn, ref, 1, "completed", 40), dropped_attempt}
        keep_text = {_text(conn, img, "m2", text_model, 40), _text(conn, img, "m0", text_model, 0),
                     _text(conn, img, "m2", "old-model", 40)}
        drop_text = {_text(conn, img, "m1", text_model, 40)}
        keep_visual = {_visual(conn, img, None, vis_model, vis_pv, 40), _visual(conn, img, "c" * 64, vis_model, vis_pv, 0)}
        drop_visual = {_visual(conn, img, "c" * 63 + "d", vis_model, vis_pv, 40)}
        conn.execute(text("INSERT INTO ops_counters (bucket, name, count) VALUES"
                          " (date_trunc('minute', now()) - interval '10 days', 'test', 1),"
                          " (date_trunc('minute', now()), 'test', 1)"))

    report = orch.sweep()
    assert report.counts["retention_errors"] == 0
    assert report.counts["pruned_jobs"] == 3 and report.counts["pruned_tasks"] == 1
    with engine.connect() as conn:
        jobs, tasks = _ids(conn, "processing_jobs"), _ids(conn, "tasks")
        attempts = _ids(conn, "task_attempts", "attempt_id")
        assert set(keep_jobs.values()) | {live_job} <= jobs
        assert not ({replaced_by_live} | set(drop_jobs.values())) & jobs
        assert set(keep_tasks.values()) <= tasks and not (set(drop_tasks.values()) | {dropped_task}) & tasks
        assert keep_attempts <= attempts and not drop_attempts & attempts
        assert keep_text <= _ids(conn, "text_embeddings") and not drop_text & _ids(conn, "text_embeddings")
        assert keep_visual <= _ids(conn, "visual_embeddings") and not drop_visual & _ids(conn, "visual_embeddings")
        assert conn.execute(text("SELECT count(*) FROM ops_counters WHERE name = 'test'")).scalar() == 1
        assert conn.execute(text("SELECT status FROM tasks WHERE job_id = :j AND status = 'queued'"),
                            {"j": live_job}).scalar() == "queued"
    assert orch.sweep().counts["pruned_jobs"] == 0  # nothing left to do

    # embeddings of a model no longer configured go only once that age is set; the current stay
    orch = Orchestrator(engine, settings.replace(**AGES, retention_old_models_s=DAY))
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM retention_walks"))
    assert orch.sweep().counts["pruned_text_embeddings"] == 1
    with engine.connect() as conn:
        models = conn.execute(text("SELECT model, metadata_hash FROM text_embeddings ORDER BY 2")).all()
    assert [tuple(m) for m in models] == [(text_model, "m0"), (text_model, "m2")]



def test_a_replaced_job_stays_while_a_newer_jobs_stage_points_at_its_task(engine, settings):
    """Dedupe links a newer job's stage to a task the replaced job owns (``tasks.job_id``): the
    replaced job is kept with it, or its delete would cascade to the task the newer stage reads."""
    from app.stages.providers import Providers
    from app.worker import executor
    from tests.support.agents import Clock
    from tests.support.pipeline import visual_task

    clock = Clock(datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc))
    s = settings.replace(**AGES)
    orch = Orchestrator(engine, s, clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(11))
    claim = orch.claim_task(visual_task(res).task_id, "w1")  # the visual task runs …
    assert claim is not None
    edited = orch.edit_context("local", uuid.UUID(res.image["id"]), display_name="renamed")  # … a context edit
    newer = uuid.UUID(str(edited.job["id"]))  # supersedes the job; the new one's visual stage links that task
    with engine.connect() as conn:
        linked = conn.execute(text("SELECT task_id FROM job_stages WHERE job_id = :j AND stage = 'visual'"),
                              {"j": newer}).scalar()
    assert newer != uuid.UUID(str(res.job["id"])) and linked == claim.task_id
    orch.complete_task(claim, executor.execute_visual(s, Providers(s), claim))

    clock.advance(days=31)  # the replaced job and the shared task are past every age
    assert orch.sweep().counts["retention_errors"] == 0
    with engine.connect() as conn:
        assert _ids(conn, "processing_jobs") >= {uuid.UUID(str(res.job["id"])), newer}
        assert claim.task_id in _ids(conn, "tasks")
    assert orch.get_task("local", claim.task_id)["status"] == "succeeded"


def test_an_attempt_whose_outcome_is_open_keeps_its_task_and_job(engine, settings):
    """A prepared, external_started or unknown_execution attempt is never deleted — not by the
    attempts walk, nor by the cascade of its task's or its job's delete."""
    orch = Orchestrator(engine, settings.replace(**AGES))
    store_and_ingest(orch, "local", png_bytes(12), process=False)  # the scope
    with engine.begin() as conn:
        img = _image(conn, "f" * 64)
        latest = _job(conn, img, 10, "succeeded", 40)
        keep, drop = set(), set()
        for n, state in enumerate(("prepared", "external_started", "unknown_execution", "failed"), start=1):
            replaced = _job(conn, img, n, "cancelled", 40)  # a replaced job's own task (jobs walk)
            own = _task(conn, replaced, "failed", 40, stage_ref=True)
            loose = _task(conn, latest, "failed", 40)  # a task no stage points at (tasks walk)
            attempts = {_attempt(conn, own, 1, state, 40), _attempt(conn, loose, 1, state, 40)}
            (drop if state == "failed" else keep).update(attempts)
    report = orch.sweep()
    assert report.counts["retention_errors"] == 0 and report.counts["pruned_jobs"] == 1
    with engine.connect() as conn:
        attempts = _ids(conn, "task_attempts", "attempt_id")
        assert keep <= attempts and not drop & attempts
        kept = conn.execute(text("SELECT count(*) FROM tasks t JOIN processing_jobs j ON j.id = t.job_id"
                                 " WHERE j.image_id = :i"), {"i": img}).scalar()
    assert kept == 6  # three open attempts' tasks under replaced jobs, three under the latest


def test_a_model_the_scopes_search_serving_names_is_never_an_old_model(engine, settings):
    """A model change (app/orchestrator/serving.py): the model a scope replaced stays for a rollback
    within MEMEFLOW_SEARCH_ROLLBACK_WINDOW_S (and while pinned), then goes like any old model."""
    orch = Orchestrator(engine, settings.replace(**AGES, retention_old_models_s=DAY))
    store_and_ingest(orch, "local", png_bytes(7), process=False)  # the scope
    orch.sweep()  # records the scope's serving state (the configured models)
    with engine.begin() as conn:
        img = _image(conn, "e" * 64)
        previous = _text(conn, img, "m2", "replaced-model", 40)
        stranger = _text(conn, img, "m2", "never-served", 40)
        prev_visual = _visual(conn, img, None, "replaced-visual", "p1", 40)
        conn.execute(text("UPDATE search_serving SET previous_model = 'replaced-model', switched_at = now()"
                          " WHERE scope_id = 'local' AND kind = 'text'"))
        conn.execute(text(
            "UPDATE search_serving SET previous_model = 'replaced-visual', previous_dims = 3,"
            " previous_ref = '{\"preprocess_version\": \"p1\"}', state = 'pinned', switched_at = now() - interval '30 days'"
            " WHERE scope_id = 'local' AND kind = 'visual'"))
        conn.execute(text("DELETE FROM retention_walks"))
    orch.sweep()
    with engine.connect() as conn:
        texts, visuals = _ids(conn, "text_embeddings"), _ids(conn, "visual_embeddings")
    assert previous in texts and stranger not in texts  # within the rollback window: kept
    assert prev_visual in visuals  # pinned: kept however old the switch
    with engine.begin() as conn:
        conn.execute(text("UPDATE search_serving SET switched_at = now() - interval '30 days' WHERE scope_id = 'local'"))
        conn.execute(text("UPDATE search_serving SET state = 'serving' WHERE scope_id = 'local' AND kind = 'visual'"))
        conn.execute(text("DELETE FROM retention_walks"))
    orch.sweep()
    with engine.connect() as conn:
        assert previous not in _ids(conn, "text_embeddings") and prev_visual not in _ids(conn, "visual_embeddings")


def test_each_sweep_deletes_a_bounded_batch_and_the_rest_later(engine, settings):
    orch = Orchestrator(engine, settings.replace(
        **AGES, retention_batch_size=4, retention_max_batches=3, retention_scan_rows=8))
    store_and_ingest(orch, "local", png_bytes(2))
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO ops_counters (bucket, name, count) SELECT date_trunc('minute', now())"
                          " - make_interval(days => 10, mins => g), 'test', 1 FROM generate_series(1, 25) g"))
        img = _image(conn, "e" * 64)
        for n in range(30):
            _text(conn, img, f"old{n}", "tm", 40)
        current = _text(conn, img, "m2", "tm", 40)
    pruned = []
    for _ in range(20):  # at most 3 batches of 4 per sweep, whatever the backlog
        counts = orch.sweep().counts
        assert counts["pruned_ops_counters"] <= 12 and counts["pruned_text_embeddings"] <= 12
        pruned.append((counts["pruned_ops_counters"], counts["pruned_text_embeddings"]))
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM text_embeddings")).scalar()
        if left == 1 and sum(p[0] for p in pruned) == 25:
            break
    assert [p[0] for p in pruned[:3]] == [12, 12, 1]
    assert sum(p[1] for p in pruned) == 30
    with engine.connect() as conn:
        assert _ids(conn, "text_embeddings") == {current}


def test_a_spent_budget_leaves_the_other_kinds_for_later_sweeps_in_turn(engine, settings):
    """With the budget spent after the first step, each sweep runs one kind — the least recently
    walked — and defers the rest: every kind has its turn within as many sweeps as there are kinds,
    and a backlog still drains."""
    orch = Orchestrator(engine, settings.replace(**{**AGES, "retention_budget_ms": 0.001}, retention_batch_size=4,
                                                 retention_max_batches=3, retention_scan_rows=8))
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO ops_counters (bucket, name, count) SELECT date_trunc('minute', now())"
                          " - make_interval(days => 10, mins => g), 'test', 1 FROM generate_series(1, 10) g"))
    ran = []
    for _ in range(2 * len(KINDS)):
        counts = retention.prune(orch)
        kinds = [k for k in KINDS if f"retention_ms_{k}" in counts]
        assert len(kinds) == 1 and counts["retention_deferred"] == len(KINDS) - 1, counts
        ran.append(kinds[0])
    assert sorted(ran[:len(KINDS)]) == sorted(KINDS) and ran[len(KINDS):] == ran[:len(KINDS)]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ops_counters WHERE name = 'test'")).scalar() == 2  # 2 × 4 of 10


def test_retention_statements_are_index_driven(engine, settings):
    orch = Orchestrator(engine, settings.replace(**AGES))
    store_and_ingest(orch, "local", png_bytes(3))
    with engine.begin() as conn:  # 4,000 images with 10 job revisions each (all but the last replaced)
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT md5('i' || g)::uuid, 'local', md5(g::text) || md5((g + 1)::text), '.png',"
            " 'image/png', 1, 1, 1, 'k', 'h' FROM generate_series(1, 4000) g"))
        conn.execute(text(
            "INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,"
            " reverse_image_policy, mode, status, completed_at)"
            " SELECT gen_random_uuid(), 'local', i.id, r, i.sha256, '{}', 'h', 'forbid', 'auto', 'superseded',"
            " now() - make_interval(days => 40, mins => r) FROM images i, generate_series(1, 10) r"
            " WHERE i.storage_key = 'k'"))
        conn.execute(text(
            "INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,"
            " image_sha256, status, max_attempts, completed_at)"
            " SELECT gen_random_uuid(), scope_id, id, 'visual', 'visual', '{}', 'f', md5(id::text), image_id,"
            " image_sha256, 'succeeded', 3, completed_at FROM processing_jobs WHERE completed_at IS NOT NULL"))
        conn.execute(text(
            "INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state,"
            " input_digest, target_sha256, updated_at) SELECT id::text, scope_id, id, 1, 1, 'completed', 'd', 's',"
            " completed_at FROM tasks WHERE completed_at IS NOT NULL"))
        conn.execute(text(  # each job's stage points at its task (the probes of a task's other references)
            "INSERT INTO job_stages (job_id, stage, scope_id, position, status, task_id)"
            " SELECT job_id, 'visual', scope_id, 0, 'succeeded', id FROM tasks WHERE completed_at IS NOT NULL"))
        conn.execute(text("INSERT INTO ops_counters (bucket, name, count) SELECT date_trunc('minute', now())"
                          " - make_interval(mins => g), 'rehint', 1 FROM generate_series(1, 40000) g"))
        conn.execute(text(  # each task's grant
            "INSERT INTO operation_grants (id, scope_id, operation, idempotency_key, task_id, state, created_at,"
            " updated_at) SELECT gen_random_uuid(), scope_id, 'analysis.agent', id::text, id, 'committed',"
            " completed_at, completed_at FROM tasks WHERE completed_at IS NOT NULL"))
        conn.execute(text(  # 2,000 ended batches of two items each, an item's job the image's latest
            "INSERT INTO batches (id, scope_id, status, select_all, reverse_image_policy, updated_at)"
            " SELECT md5('b' || g)::uuid, 'local', 'completed', true, 'forbid', now() - interval '40 days'"
            " FROM generate_series(0, 1999) g"))
        conn.execute(text(
            "INSERT INTO batch_items (batch_id, image_id, scope_id, job_id)"
            " SELECT md5('b' || (n % 2000))::uuid, i.id, 'local', j.id"
            " FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM images WHERE storage_key = 'k') i"
            " JOIN processing_jobs j ON j.image_id = i.id AND j.revision = 10"))
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
            " document_version, document, embedding, created_at) SELECT 'local', i.id, i.sha256, 'old' || r, 'tm', 3,"
            " '1', '', '[1,0,0]', now() - interval '40 days' FROM images i, generate_series(1, 10) r"
            " WHERE i.storage_key = 'k'"))
        conn.execute(text("ANALYZE"))
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().startswith(("DELETE", "WITH scan")):  # every retention statement
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        retention.prune(orch)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    heads = {(m.group(1) if (m := re.search(r"WITH scan AS MATERIALIZED \(SELECT \S+ AS k FROM (\w+)", st))
              else " ".join(st.split()[:3])) for st, _ in captured}
    assert heads >= {"tasks", "task_attempts", "processing_jobs", "text_embeddings", "visual_embeddings",
                     "operation_grants", "batch_items", "batches", "DELETE FROM ops_counters"}, heads
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert not re.search(r"Seq Scan on (tasks|processing_jobs|task_attempts|job_stages|ops_counters|"
                                 r"text_embeddings|images|operation_grants|batches|batch_items)",
                                 plan), (statement, plan)


def test_a_kind_whose_walk_fails_every_sweep_does_not_keep_the_other_kinds_deferred(engine, settings, monkeypatch):
    """A kind whose walk step raised (a lock timeout, a statement timeout — longer than the budget)
    recorded no turn: it stayed the least recently walked, ran first at every sweep, spent the budget
    and deferred every other kind at every sweep — no other history was pruned any more. Its turn is
    recorded even when it fails, so the others have theirs."""
    from sqlalchemy.exc import OperationalError

    orch = Orchestrator(engine, settings.replace(**{**AGES, "retention_budget_ms": 0.001}))
    real_walk = retention._walk

    def walk(orch_, kind, params, deadline):
        if kind == "jobs":
            raise OperationalError("DELETE FROM processing_jobs", {}, Exception("canceling statement due to lock timeout"))
        return real_walk(orch_, kind, params, deadline)

    monkeypatch.setattr(retention, "_walk", walk)
    ran = []
    for _ in range(3):
        counts = retention.prune(orch)
        ran += [k for k in KINDS if f"retention_ms_{k}" in counts]
    assert ran[0] == "jobs" and counts["retention_errors"] <= 1
    assert set(ran) - {"jobs"}, ran  # the other kinds had turns
