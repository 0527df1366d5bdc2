"""The set-based batch statements (jsonb_to_recordset rows, estimated at 100 by the planner) must
still reach their rows by index on big tables: EXPLAIN every statement a visual, agent and
embedding batch sends, on a history of 60k finished jobs (180k stages, 60k tasks, attempts and
grants)."""

from __future__ import annotations

import dataclasses
import re

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.pipeline import (
    big_finished_history,
    bulk_jobs_with_tasks,
    plan_nodes,
    png_bytes,
    store_and_ingest,
    visual_task,
)

BIG = r"Seq Scan on (tasks|processing_jobs|job_stages|task_attempts|operation_grants)"


def test_every_batch_statement_reaches_its_rows_by_index_on_a_big_history(engine, settings):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    visual = [visual_task(store_and_ingest(orch, "local", png_bytes(s))) for s in range(120, 124)]
    with engine.begin() as conn:
        big_finished_history(conn)
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if not executemany and statement.lstrip().upper().startswith(("WITH", "SELECT", "UPDATE", "INSERT")):
            captured.append((statement, parameters))

    providers, pub = Providers(settings), RecordingPublisher()
    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert handle_hint(orch, "visual", visual[0].task_id, "w", providers, pub) == 4
        [agent] = [h for h in pub.drain() if h.lane == "agent"]
        assert handle_hint(orch, "agent", agent.task_id, "w", providers, pub) == 4
        [embedding] = [h for h in pub.drain() if h.lane == "embedding"]
        assert handle_hint(orch, "embedding", embedding.task_id, "w", providers, pub) == 4
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert orch.get_job("local", store_and_ingest(orch, "local", png_bytes(120)).job["id"])["status"] == "succeeded"
    shapes = {s for s, _ in captured}
    assert any("jsonb_to_recordset" in s for s in shapes) and len(shapes) >= 15
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert not re.search(BIG, plan), (statement, plan)
        conn.rollback()


def test_the_current_text_embedding_check_reads_one_row_when_statistics_are_stale(engine, settings):
    """A fresh library filling up: text_embeddings was analyzed while empty, then 3,000 rows of
    the scope arrived. Each job's "is its text embedding current?" check (job facts, run by every
    batch completion) must still read only the row it asks for — not every embedding of the scope
    (it did while ``ix_text_embeddings_scope_model`` existed: the planner took it, estimating one row)."""
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(130))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE text_embeddings"))
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
            " document_version, document, embedding, created_at) SELECT i.scope_id, i.id, i.sha256, md5(g::text),"
            " 'deterministic-text-v1', 64, 'v1', 'd', array_fill(0.1, ARRAY[64])::vector, now()"
            " FROM images i, generate_series(1, 3000) g"
        ))
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "FROM text_embeddings" in statement and not executemany:
            captured.append((statement, parameters))

    providers, pub = Providers(settings), RecordingPublisher()
    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert handle_hint(orch, "visual", visual_task(res).task_id, "w", providers, pub) == 1
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert captured
    with engine.connect() as conn:
        for statement, parameters in captured:
            [[plan]] = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).all()
            reads = [n for n in plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "text_embeddings"]
            assert reads, plan
            for node in reads:
                assert node["Actual Rows"] + node.get("Rows Removed by Filter", 0) <= 1, (statement, node)
        conn.rollback()


def test_a_config_replan_reaches_the_images_earlier_jobs_by_index_on_a_big_history(engine, settings):
    """A rolling model change replans every job planned under the old configuration
    (app/orchestrator/replan.py); counting the image's earlier replans must read its newest jobs
    through (scope_id, image_id, revision) — not scan every job of the library (PostgreSQL 17
    cannot skip the index's leading scope_id)."""
    old = settings.replace(visual_provider="deterministic")
    new = settings.replace(visual_provider="perceptual-v1")
    orch_old, orch_new = Orchestrator(engine, old), Orchestrator(engine, new)
    for s in range(140, 143):
        store_and_ingest(orch_old, "local", png_bytes(s))
    with engine.begin() as conn:
        bulk_jobs_with_tasks(conn, 20000, lane="agent", task_status="succeeded")  # 3 images × 20k ended jobs
    res = store_and_ingest(orch_old, "local", png_bytes(143))  # planned under the old model
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "FROM processing_jobs" in statement and not executemany:
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        handle_hint(orch_new, "visual", visual_task(res).task_id, "w", Providers(new), RecordingPublisher())
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert orch_new.get_job("local", res.job["id"])["status"] == "superseded"  # the replan ran
    earlier = [s for s, _ in captured if "'running') ORDER BY revision DESC" in s]  # jobs.EARLIER_JOB_ENDS
    assert earlier, captured
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert "Seq Scan on processing_jobs" not in plan, (statement, plan)
        conn.rollback()
