"""The reconcile sweep: what it repairs, the advisory lock, and that its SQL is index-driven."""

from __future__ import annotations

import re
import time

from sqlalchemy import event, text

from app.orchestrator import Orchestrator
from app.orchestrator.store import sweep as q
from tests.support.clock import FakeClock
from tests.support.pipeline import bulk_jobs_with_tasks, png_bytes, store_and_ingest, visual_task


def test_sweep_rehints_stale_and_expired_and_skips_when_locked(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    a = store_and_ingest(orch, "local", png_bytes(1))
    b = store_and_ingest(orch, "local", png_bytes(2))
    claimed = orch.claim_task(visual_task(b).task_id, "dead-worker")
    assert claimed is not None
    assert orch.sweep().hints == []  # hints are fresh: nothing to do
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert {h.task_id for h in report.hints} == {visual_task(a).task_id, visual_task(b).task_id}
    assert report.counts["rehinted"] == 1 and report.counts["lease_expired"] == 1
    assert orch.sweep().hints == []  # re-hinted once per grace period, not every run
    with engine.connect() as other:
        assert q.try_lock(other)
        skipped = orch.sweep()
        assert skipped.skipped and skipped.held is None
        q.unlock(other)
        other.commit()
    before = time.time()
    ran = orch.sweep()
    after = time.time()
    # the interval it held the lock, within the call (what the worker logs as the sweep's start/end)
    assert not ran.skipped and before <= ran.held[0] <= ran.held[1] <= after


def _explain(conn, sql, params):
    return "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql), params))


def test_sweep_queries_use_indexes_on_200k_finished_tasks(engine, settings):
    orch = Orchestrator(engine, settings)
    store_and_ingest(orch, "local", png_bytes(3))
    with engine.begin() as conn:
        bulk_jobs_with_tasks(conn, 200000, lane="visual", task_status="succeeded")
        conn.execute(text("ANALYZE job_stages"))
    # capture every statement the real sweep sends, then EXPLAIN each one with its parameters
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if ("tasks" in statement or "processing_jobs" in statement) and not statement.startswith(("EXPLAIN", "ANALYZE")):
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        report = orch.sweep()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert not report.skipped and len(captured) >= 4
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert not re.search(r"Seq Scan on (tasks|processing_jobs)", plan), (statement, plan)
        claim_plan = _explain(
            conn, "SELECT id FROM tasks WHERE lane = 'visual' AND status = 'queued' AND available_at <= :now"
            " ORDER BY priority DESC, available_at LIMIT 10 FOR UPDATE SKIP LOCKED", {"now": orch.now()},
        )
        assert "Seq Scan on tasks" not in claim_plan, claim_plan


def test_sweep_advances_a_job_whose_task_finished_without_advancing_it(engine, settings):
    """Defence in depth: a task that ended behind the orchestrator's back (here: by hand) gets its
    job moved on by the sweep, which finds it through the recently-finished-tasks index."""
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(7))
    task_id = visual_task(res).task_id
    with engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET status = 'cancelled', completed_at = :t WHERE id = :id"),
                     {"t": clock(), "id": task_id})
    clock.advance(settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert report.counts["jobs_advanced"] == 1
    (hint,) = [h for h in report.hints if h.task_id != task_id]
    job = orch.get_job("local", res.job["id"])
    assert job["stages"][0]["task_id"] == str(hint.task_id) and job["stages"][0]["status"] == "queued"
    assert orch.sweep().counts["jobs_advanced"] == 0  # repaired once, then nothing left to do


def test_a_failing_step_is_isolated_counted_and_recorded(engine, settings, monkeypatch):
    """One step that raises (a bug, a lock timeout) stops none of the others: the re-hints and the
    webhook hints still come back, the gauges are still recorded, and the sweep's record names the
    step that failed (``sweep_state.failed_steps``) until a sweep without failures replaces it."""
    from app import metrics
    from app.orchestrator import sweep as sweep_mod
    from app.orchestrator.store import events as events_q

    clock = FakeClock()
    orch = Orchestrator(engine, settings.replace(webhook_allowed_networks="127.0.0.0/8"), clock=clock)
    a = store_and_ingest(orch, "local", png_bytes(11))
    orch.create_webhook("local", "http://127.0.0.1:9/hook")
    with engine.begin() as conn:
        events_q.stage_event_txn(conn, "local", "batch.progress", {"n": 1})
    clock.advance(settings.rehint_grace_s + 1)

    def broken(orch, report):
        raise RuntimeError("boom")

    steps = dict(sweep_mod.STEPS)
    before = {name: metrics.SWEEP_STEP_FAILURES.labels(name)._value.get() for name in ("serving", "retention")}
    monkeypatch.setattr(sweep_mod, "STEPS", [(name, broken if name in ("serving", "retention") else fn)
                                             for name, fn in steps.items()])
    report = orch.sweep()
    assert [f["step"] for f in report.failed_steps] == ["serving", "retention"]
    assert report.failed_steps[0]["error"] == "RuntimeError" and report.counts["steps_failed"] == 2  # (text: the log)
    assert visual_task(a).task_id in {h.task_id for h in report.hints}  # the re-hint step ran before
    assert report.counts["webhooks_hinted"] == 1 and any(h.lane == "webhooks" for h in report.hints)  # and after
    for name in ("serving", "retention"):
        assert metrics.SWEEP_STEP_FAILURES.labels(name)._value.get() == before[name] + 1
    with engine.connect() as conn:
        state = q.sweep_state(conn)
    assert [f["step"] for f in state["failed_steps"]] == ["serving", "retention"] and state["lane_gauges"]
    monkeypatch.setattr(sweep_mod, "STEPS", list(steps.items()))
    assert orch.sweep().failed_steps == []
    with engine.connect() as conn:
        assert q.sweep_state(conn)["failed_steps"] == []


def test_liveness_reports_the_last_sweeps_failed_steps(engine, settings):
    from app.orchestrator.liveness import read_liveness

    with engine.begin() as conn:
        q.record_sweep_txn(conn, None, 0.1, {}, [{"step": "retention", "error": "OperationalError: x"}])
    live = read_liveness(engine, settings).as_dict()
    assert live["sweep"]["failed_steps"] == [{"step": "retention", "error": "OperationalError: x"}]
