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
