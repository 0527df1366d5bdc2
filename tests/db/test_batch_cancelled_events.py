"""A cancelled batch's events end with the counts its cancel left (docs/events.md). The batch is
marked cancelled first (seeding stops) and its jobs are cancelled after, so ``batch.cancelled``
counts them as they were then — still queued; one ``batch.progress`` (status ``cancelled``) follows
with the counts the cancel left, so a client following the stream does not keep a cancelled batch
with queued work for good."""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.store import events as q
from tests.support.pipeline import png_bytes, store_and_ingest


def _batch_events(engine, batch_id: str) -> list[tuple[str, dict]]:
    with engine.connect() as c:
        return [(r["type"], dict(r["payload"])) for r in q.events_after_txn(c, "s1", 0, 1000)
                if str(r["batch_id"]) == batch_id and r["type"].startswith("batch.")]


def test_the_last_event_of_a_cancelled_batch_has_the_counts_its_cancel_left(engine, settings):
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(3)]
    batch, hints = orch.create_batch("s1", image_ids=ids)
    pub.publish(hints)
    assert orch.cancel_batch("s1", batch["id"])["counts"] == {"cancelled": 3}
    events = _batch_events(engine, batch["id"])
    assert [t for t, _ in events] == ["batch.cancelled", "batch.progress"], events
    assert events[0][1]["counts"] == {"queued": 3}  # when it was marked
    assert events[-1][1]["status"] == "cancelled" and events[-1][1]["counts"] == {"cancelled": 3}
    assert events[-1][1]["progress"] == 1.0
    orch.cancel_batch("s1", batch["id"])  # again: nothing left to cancel, nothing new to tell
    orch.sweep()
    assert len(_batch_events(engine, batch["id"])) == 2


def test_a_cancel_that_left_nothing_to_cancel_adds_no_event(engine, settings):
    orch = Orchestrator(engine, settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(2)]
    batch, _ = orch.create_batch("s1", image_ids=ids)
    for job_id in orch.list_jobs("s1")[0]:
        orch.cancel_job("s1", job_id["id"])  # every job already ended before the batch's cancel
    orch.cancel_batch("s1", batch["id"])
    assert [t for t, _ in _batch_events(engine, batch["id"])] == ["batch.cancelled"]


def _run_all(orch, pub, providers) -> None:
    from app.worker.run import handle_hint

    for _ in range(30):
        hints = pub.drain()
        if not hints:
            return
        for h in hints:
            if h.task_id is not None:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)


def test_a_cancelled_batch_tells_the_counts_of_jobs_it_adopted_and_left_running(engine, settings):
    """A batch adopts an image's active job (an upload's); its cancel leaves that job alone (the batch
    did not create it), so its counts change after the cancel's last event: the sweep tells them,
    until every item job has ended — the batch's last event carries its final counts."""
    from app.stages.providers import Providers

    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    uploads = [store_and_ingest(orch, "s1", png_bytes(20 + i)) for i in range(2)]
    for res in uploads:
        pub.publish(res.hints)
    batch, hints = orch.create_batch("s1", image_ids=[res.image["id"] for res in uploads])
    pub.publish(hints)
    assert orch.cancel_batch("s1", batch["id"])["counts"] == {"queued": 2}  # the uploads' jobs go on
    _run_all(orch, pub, providers)
    final = orch.get_batch("s1", batch["id"])
    assert final["status"] == "cancelled" and final["counts"] == {"succeeded": 2}, final
    orch.sweep()
    events = _batch_events(engine, batch["id"])
    assert events[-1][0] == "batch.progress" and events[-1][1]["counts"] == final["counts"], events
    assert events[-1][1]["status"] == "cancelled" and events[-1][1]["progress"] == 1.0
    n = len(events)
    orch.sweep()  # final: nothing more to tell, and the sweep no longer looks at it
    assert len(_batch_events(engine, batch["id"])) == n
    with engine.connect() as c:
        from sqlalchemy import text

        assert c.execute(text("SELECT progress_open FROM batches WHERE id = :b"), {"b": batch["id"]}).scalar() is False
