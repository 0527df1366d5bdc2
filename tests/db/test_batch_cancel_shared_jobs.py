"""Two batches over the same images share their jobs: the second adopts each image's active job
the first created. Cancelling the first stops its seeding and its own work, but a job that an item
of another batch still running follows stays: cancelling it would end the other batch's item
``cancelled`` — an image that batch was asked to process, never processed, and never retried."""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.pipeline import png_bytes, store_and_ingest


def _run_all(orch, pub, providers) -> None:
    for _ in range(30):
        hints = pub.drain()
        if not hints:
            return
        for h in hints:
            if h.task_id is not None:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)


def test_cancelling_a_batch_keeps_the_jobs_another_running_batch_follows(engine, settings):
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(3)]
    first, hints = orch.create_batch("s1", image_ids=ids)
    pub.publish(hints)
    second, hints = orch.create_batch("s1", image_ids=ids[:2])  # adopts the first's two active jobs
    pub.publish(hints)
    assert orch.get_batch("s1", second["id"])["counts"] == {"queued": 2}

    cancelled = orch.cancel_batch("s1", first["id"])
    assert cancelled["status"] == "cancelled"
    assert cancelled["counts"] == {"queued": 2, "cancelled": 1}  # only the job nobody else follows
    assert orch.get_batch("s1", second["id"])["counts"] == {"queued": 2}

    _run_all(orch, pub, providers)
    orch.sweep()
    done = orch.get_batch("s1", second["id"])
    assert done["status"] == "completed" and done["counts"] == {"succeeded": 2}, done
    assert orch.cancel_batch("s1", first["id"])["status"] == "cancelled"  # again: still cancelled

    # with no other batch following them, a cancel ends them all
    third, hints = orch.create_batch("s1", image_ids=[ids[2]])
    pub.publish(hints)
    assert orch.cancel_batch("s1", third["id"])["counts"] == {"cancelled": 1}
