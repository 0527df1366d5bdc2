"""The sweep's batch step (SPEC §4.8, §4.9) looks at a bounded number of batches per run, yet no
batch waits on others forever: a running batch whose item jobs all ended completes at the next
sweep however many long batches run, every running batch gets its ``batch.progress`` turn, and a
scope's seeding batch is seeded although more scopes than one sweep looks at are paused by their
back-pressure."""

from __future__ import annotations

import dataclasses

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.batches import SWEEP_BATCHES
from app.orchestrator.store import batches as q
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest


def _run_all(orch, pub, providers):
    for _ in range(20):
        for h in pub.drain():
            if h.task_id is not None:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)


def _long_batches(orch, clock, n, first_seed=300):
    """``n`` scopes, each with a process-all batch seeded and running whose job stays queued."""
    out = []
    for i in range(n):
        store_and_ingest(orch, f"big-{i}", png_bytes(first_seed + i), process=False)
        batch, _ = orch.create_batch(f"big-{i}", all=True)
        out.append((f"big-{i}", batch["id"]))
        clock.advance(0.01)
    return out


def _processed_image(orch, scope, seed):
    pub, providers = RecordingPublisher(), Providers(orch.settings)
    res = store_and_ingest(orch, scope, png_bytes(seed))
    pub.publish(res.hints)
    _run_all(orch, pub, providers)
    assert orch.get_job(scope, res.job["id"])["status"] == "succeeded"


def test_a_finished_batch_completes_at_the_next_sweep_however_many_long_batches_run(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    _processed_image(orch, "small", 7)
    long = _long_batches(orch, clock, SWEEP_BATCHES + 5)  # tenants' process-all, their jobs still queued
    batch, _ = orch.create_batch("small", all=True)  # its only image is done: nothing to run
    assert orch.get_batch("small", batch["id"])["status"] == "running"
    clock.advance(settings.sweep_interval_s)
    orch.sweep()
    b = orch.get_batch("small", batch["id"])
    assert b["status"] == "completed" and b["progress"] == 1.0, b
    assert all(orch.get_batch(s, bid)["status"] == "running" for s, bid in long)


def test_every_running_batch_gets_its_progress_turn(engine, settings):
    """The unfinished batches rotate through the step's window: each is checked (and its
    batch.progress event staged) within ceil(running / SWEEP_BATCHES) sweeps."""
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    long = _long_batches(orch, clock, SWEEP_BATCHES + 5)
    for _ in range(2):
        clock.advance(settings.sweep_interval_s)
        orch.sweep()
    with engine.connect() as conn:
        progressed = {str(r[0]) for r in conn.execute(text(
            "SELECT batch_id FROM events WHERE type = 'batch.progress'"))}
    assert progressed == {bid for _, bid in long}


def test_a_batch_whose_adopted_job_is_still_active_does_not_hold_the_window(engine, settings):
    """A batch may adopt an image's active job it did not create (an upload's; same policy). Until
    that job ends, the batch looks completable by its own jobs but is not; it goes to the back of
    the round instead of holding the front for ever, so a finished batch behind more such batches
    than one sweep checks completes within ceil((adopters + 1) / SWEEP_BATCHES) sweeps."""
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    _processed_image(orch, "done", 8)
    adopted = []
    for i in range(SWEEP_BATCHES + 1):  # each batch adopts the upload's queued job
        store_and_ingest(orch, f"adopt-{i}", png_bytes(500 + i))
        batch, _ = orch.create_batch(f"adopt-{i}", all=True)
        adopted.append((f"adopt-{i}", batch["id"]))
        clock.advance(0.01)
    batch, _ = orch.create_batch("done", all=True)
    assert orch.get_batch("done", batch["id"])["status"] == "running"
    for _ in range(2):
        clock.advance(settings.sweep_interval_s)
        orch.sweep()
    assert orch.get_batch("done", batch["id"])["status"] == "completed"
    assert all(orch.get_batch(s, bid)["status"] == "running" for s, bid in adopted)


def test_a_scope_seeds_although_more_scopes_are_paused_than_one_sweep_looks_at(engine, settings):
    """Back-pressure leaves a paused batch as it was; the sweep's seeding heads (LIMIT
    SWEEP_BATCHES, least recently touched first) were then the same paused scopes every run."""
    clock = FakeClock()
    orch = Orchestrator(engine, dataclasses.replace(settings, batch_page_size=1, batch_backlog_threshold=0),
                        clock=clock)
    for i in range(SWEEP_BATCHES + 1):  # scopes over their threshold, each with a paused batch
        store_and_ingest(orch, f"busy-{i}", png_bytes(700 + i))
        store_and_ingest(orch, f"busy-{i}", png_bytes(800 + i), process=False)
        paused, _ = orch.create_batch(f"busy-{i}", all=True)
        assert paused["status"] == "seeding" and sum(paused["counts"].values()) == 0
        clock.advance(0.01)
    busy = store_and_ingest(orch, "late", png_bytes(900))
    store_and_ingest(orch, "late", png_bytes(901), process=False)
    late, _ = orch.create_batch("late", all=True)
    assert sum(late["counts"].values()) == 0  # its own backlog pauses it
    orch.cancel_job("late", busy.job["id"])  # now it may seed
    for _ in range(3):  # ceil(22 / 20) + 1 rounds of the seeding heads
        clock.advance(settings.sweep_interval_s)
        orch.sweep()
    assert sum(orch.get_batch("late", late["id"])["counts"].values()) >= 1


def test_the_batch_steps_queries_are_index_driven(engine, settings):
    """The completable-batches anti-join probes ix_processing_jobs_batch per running batch."""
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "FROM batches" in statement and not statement.startswith("EXPLAIN"):
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        with engine.connect() as conn:
            q.completable_batches_txn(conn, SWEEP_BATCHES)
            q.running_batches_txn(conn, SWEEP_BATCHES)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert len(captured) == 2
    with engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))  # tiny tables: ask which plan an index allows
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert "Seq Scan" not in plan, plan
