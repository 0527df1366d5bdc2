"""Open wake-up groups: a new task of a batched lane created on its own (an upload) joins the
newest queued, never-claimed group of its scope instead of publishing a hint of its own — and no
joined task is ever left queued with its group's hint spent."""

from __future__ import annotations

import dataclasses
import threading

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.conftest import poll_until
from tests.support.pipeline import Workers, png_bytes, store_and_ingest, visual_task


def _rows(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).all()


def _scalar(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar()


def test_a_burst_of_uploads_publishes_one_hint_per_batch(engine, settings):
    # groups of 4: a batch of 5 less the one slot each claim keeps for the fair fill
    orch = Orchestrator(engine, dataclasses.replace(settings, visual_batch_size=5))
    results = [store_and_ingest(orch, "local", png_bytes(s)) for s in range(10, 19)]
    hints = [h for r in results for h in r.hints]
    tasks = [visual_task(r).task_id for r in results]
    # groups of 4: the first upload of each is named by the one hint
    assert [h.task_id for h in hints] == [tasks[0], tasks[4], tasks[8]]
    groups = _rows(engine, "SELECT coalesce(hint_group, id), count(*) FROM tasks GROUP BY 1 ORDER BY min(created_at)")
    assert [(g, n) for g, n in groups] == [(tasks[0], 4), (tasks[4], 4), (tasks[8], 1)]
    assert dict(_rows(engine, "SELECT id, hint_members FROM tasks WHERE hint_group IS NULL")) == {
        tasks[0]: 3, tasks[4]: 3, tasks[8]: 0}
    # nothing is left queued
    pub = RecordingPublisher()
    claimed = [handle_hint(orch, "visual", h.task_id, "w1", Providers(orch.settings), pub) for h in hints]
    # each hint claims its whole group and fills the rest of its batch fairly (here: the next upload)
    assert claimed == [5, 4, 0]
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'visual' AND status <> 'succeeded'") == 0


def test_an_upload_after_its_group_was_claimed_hints_for_itself(engine, settings):
    orch = Orchestrator(engine, settings)
    first = store_and_ingest(orch, "local", png_bytes(20))
    assert len(first.hints) == 1
    assert store_and_ingest(orch, "local", png_bytes(21)).hints == []  # joined
    assert len(orch.claim_with_batch(first.hints[0].task_id, "visual", 16, "w1").claims) == 2
    later = store_and_ingest(orch, "local", png_bytes(22))
    assert [h.task_id for h in later.hints] == [visual_task(later).task_id]
    # another scope never joins this scope's group
    other = store_and_ingest(orch, "other", png_bytes(23))
    assert [h.task_id for h in other.hints] == [visual_task(other).task_id]


def test_a_group_is_claimed_whole_by_a_worker_with_a_smaller_batch(engine, settings):
    """The API process made groups of 4; a worker configured for batches of 2 still takes all 4
    (a member left behind would have lost its hint)."""
    api = Orchestrator(engine, dataclasses.replace(settings, visual_batch_size=5))  # groups of 4
    results = [store_and_ingest(api, "local", png_bytes(s)) for s in range(30, 34)]
    (hint,) = [h for r in results for h in r.hints]
    worker = Orchestrator(engine, dataclasses.replace(settings, visual_batch_size=2))
    assert len(worker.claim_with_batch(hint.task_id, "visual", 2, "w1").claims) == 4


def test_a_claim_waits_for_an_upload_that_is_joining_its_group(engine, settings):
    """The upload holds the group's named task locked from its join until its commit; the hint's
    claim waits for that commit and then takes the new member too. (Without the wait the claim
    would skip the locked task, and task and member would stay queued with the hint spent.)"""
    orch = Orchestrator(engine, settings)
    first = store_and_ingest(orch, "local", png_bytes(40))
    (hint,) = first.hints

    joined, release = threading.Event(), threading.Event()

    def pause_after_join(conn, cursor, statement, parameters, context, executemany):
        if (threading.current_thread().name == "uploader" and not joined.is_set()
                and statement.startswith("WITH r AS (SELECT * FROM jsonb_to_recordset") and "INSERT INTO tasks" in statement):
            joined.set()  # the join (UPDATE … hint_members) ran in this transaction
            release.wait(30)

    event.listen(engine, "before_cursor_execute", pause_after_join)
    result: dict = {}
    uploader = threading.Thread(target=lambda: result.update(up=store_and_ingest(orch, "local", png_bytes(41))),
                                name="uploader")
    uploader.start()
    try:
        assert joined.wait(30)
        claimer = threading.Thread(target=lambda: result.update(
            claims=orch.claim_with_batch(hint.task_id, "visual", 16, "w1").claims))
        claimer.start()
        poll_until(lambda: _scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                           " AND query LIKE 'SELECT id FROM tasks WHERE id = %'") == 1,
                   timeout=30, what="the claim waits for the joining upload")
    finally:
        release.set()
        uploader.join(30)
    claimer.join(30)
    event.remove(engine, "before_cursor_execute", pause_after_join)
    assert result["up"].hints == []
    member = visual_task(result["up"]).task_id
    assert {c.task_id for c in result["claims"]} == {hint.task_id, member}
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE status = 'queued'") == 0


def test_concurrent_uploads_and_workers_finish_every_job_without_a_sweep(engine, settings):
    """Four uploaders racing two workers: uploads join groups while hints of those groups are
    being claimed. Every job must finish from the published hints alone (no sweep runs)."""
    orch = Orchestrator(engine, dataclasses.replace(settings, visual_batch_size=4, embedding_batch_size=4))
    pub = RecordingPublisher()
    per, n_up = 15, 4
    errors: list[BaseException] = []
    # Two uploads before any worker runs: the second joins the first's open group, so the premise
    # checked at the end (uploads shared hints) holds by construction, however fast the box is; the
    # racing uploads below then join groups while the workers claim them.
    for i in range(2):
        pub.publish(store_and_ingest(orch, "local", png_bytes(900 + i)).hints)

    def upload(u: int) -> None:
        try:
            for i in range(per):
                pub.publish(store_and_ingest(orch, "local", png_bytes(1000 + u * 100 + i)).hints)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    uploaders = [threading.Thread(target=upload, args=(u,)) for u in range(n_up)]
    with Workers(orch, pub, n=2):
        for t in uploaders:
            t.start()
        for t in uploaders:
            t.join(120)
        assert errors == []
        poll_until(lambda: _scalar(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")
                   == per * n_up + 2, timeout=120, interval=0.1, what="every job succeeded from its hints alone")
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE status <> 'succeeded'") == 0
    # and uploads did share hints (the second upload joined the first's group before any claim)
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'visual' AND hint_group IS NOT NULL") > 0



def test_joining_finds_the_newest_group_by_index_behind_a_big_queued_backlog(engine, settings):
    """Every upload runs the join: behind 50k queued visual tasks of a library batch (priority 0)
    it must reach the newest upload group (priority 1) by ``ix_tasks_open_group`` (custom and
    generic plan), never scan the backlog."""
    import re

    from tests.support.pipeline import bulk_jobs_with_tasks

    orch = Orchestrator(engine, settings)
    first = store_and_ingest(orch, "local", png_bytes(60))
    with engine.begin() as conn:
        bulk_jobs_with_tasks(conn, 50000, lane="visual", task_status="queued")  # newer, priority 0
    captured: list = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "hint_members = hint_members +" in statement:
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert store_and_ingest(orch, "local", png_bytes(61)).hints == []  # it joined the upload group
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    (statement, parameters), = captured
    with engine.connect() as conn:
        custom = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
        names = list(parameters)
        prepared = statement
        for i, name in enumerate(names, 1):
            prepared = prepared.replace(f"%({name})s", f"${i}")
        types = {"k": "int", "s": "text", "lane": "text", "rk": "text", "p": "int", "now": "timestamptz", "size": "int"}
        conn.exec_driver_sql(f"PREPARE join_group({', '.join(types[n] for n in names)}) AS {prepared}")
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        literal = {n: "'" + str(parameters[n]).replace("'", "''") + f"'::{types[n]}" for n in names}
        generic = "\n".join(r[0] for r in conn.exec_driver_sql(
            f"EXPLAIN EXECUTE join_group({', '.join(literal[n] for n in names)})"))
        conn.rollback()
    assert _scalar(engine, "SELECT hint_members FROM tasks WHERE id = :t", t=visual_task(first).task_id) == 1
    for plan in (custom, generic):
        assert "ix_tasks_open_group" in plan and not re.search(r"Seq Scan on tasks|Sort", plan), plan
