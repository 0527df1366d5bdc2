"""/ops refreshes every 5 s, and ``memeflow status`` reads the same queries: a small tenant's page
must cost what that tenant holds, not what every tenant holds. EXPLAIN every statement the
overview and the per-image page send for a small scope, next to another scope's history of 60k
finished jobs (180k stages, 60k tasks and attempts): none may read a big table whole."""

from __future__ import annotations

import re

from sqlalchemy import event, text

from app.ops import queries
from app.orchestrator import Orchestrator
from tests.support.pipeline import big_finished_history, png_bytes, store_and_ingest

BIG = r"Seq Scan on (tasks|processing_jobs|job_stages|task_attempts|operation_grants|batch_items)"


def test_a_small_scopes_ops_reads_reach_its_rows_by_index_next_to_a_big_tenant(engine, settings):
    orch = Orchestrator(engine, settings)
    for seed in range(140, 144):
        store_and_ingest(orch, "big", png_bytes(seed))
    with engine.begin() as conn:
        big_finished_history(conn)  # 60k jobs of scope "big"
    small = store_and_ingest(orch, "small", png_bytes(150))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if not executemany and statement.lstrip().upper().startswith(("WITH", "SELECT")):
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        overview = queries.overview(engine, "small", {"agent": 2}, settings)
        detail = queries.image_detail(engine, "small", small.image["id"])
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert overview.total_jobs == 1 and detail is not None and len(detail.jobs) == 1
    assert any("FROM job_stages" in s for s, _ in captured)
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert not re.search(BIG, plan), (statement, plan)
        conn.rollback()


def test_the_image_page_shows_the_newest_tasks_and_attempts_of_a_long_history(engine, settings):
    """The task timeline and the agent attempts are capped at 200 rows. They were the *oldest* 200,
    so an image with a long history (context edits, retries) showed none of its recent tasks — the
    current failure an operator opens the page for. Now the newest 200, oldest first."""
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(160))
    with engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
                reverse_image_policy, mode, status, created_at, updated_at)
            SELECT gen_random_uuid(), i.scope_id, i.id, 100 + g, i.sha256, '{}', 'h', 'forbid', 'auto', 'failed',
                now() - interval '1 day' + g * interval '1 second', now() - interval '1 day' + g * interval '1 second'
              FROM images i, generate_series(1, 300) g"""))
        conn.execute(text("""
            INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
                image_sha256, status, max_attempts, available_at, last_hint_at, created_at, updated_at)
            SELECT gen_random_uuid(), j.scope_id, j.id, 'agent', 'agent', '{}', 'f', md5(j.id::text), j.image_id,
                j.image_sha256, 'failed', 3, j.created_at, j.created_at, j.created_at, j.created_at
              FROM processing_jobs j WHERE j.revision >= 100"""))
        conn.execute(text("""
            INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state,
                input_digest, target_sha256, created_at, updated_at)
            SELECT md5(t.id::text), t.scope_id, t.id, 1, 1, 'failed', 'f', 'x', t.created_at, t.created_at
              FROM tasks t WHERE t.input_fingerprint = 'f'"""))
    detail = queries.image_detail(engine, "local", res.image["id"])
    assert detail is not None
    with engine.connect() as conn:
        newest_task = conn.execute(text("SELECT id FROM tasks ORDER BY created_at DESC LIMIT 1")).scalar_one()
        newest_attempt = conn.execute(text("SELECT max(created_at) FROM task_attempts")).scalar_one()
    tasks = [t["created_at"] for t in detail.tasks]
    assert len(tasks) == 200 and tasks == sorted(tasks)  # a timeline: oldest first
    assert detail.tasks[-1]["id"] == newest_task  # the upload's own task, after 300 older ones
    assert detail.tasks[0]["revision"] == 202  # 99 of the 300 old ones left out
    attempts = [a["created_at"] for a in detail.attempts]
    assert len(attempts) == 200 and attempts == sorted(attempts) and attempts[-1] == newest_attempt
