"""Batches at scale (SPEC §4.8, §4.9): progress stays exact when images are deleted midway."""

from __future__ import annotations

import dataclasses

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.pipeline import png_bytes, store_and_ingest


def _run_all(orch, pub, providers):
    for _ in range(30):
        hints = pub.drain()
        if not hints:
            return
        for h in hints:
            if h.task_id is not None:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)


def _settle(orch, pub, providers, sweeps=3):
    for _ in range(sweeps):
        _run_all(orch, pub, providers)
        pub.publish(orch.sweep().hints)
        _run_all(orch, pub, providers)


def test_images_deleted_before_their_page_is_seeded_leave_an_exact_completed_batch(engine, settings):
    settings = dataclasses.replace(settings, batch_page_size=2)
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(6)]
    batch, hints = orch.create_batch("s1", all=True, first_page_size=1)  # the API seeds a first page only
    pub.publish(hints)
    assert batch["total"] == 6
    for image_id in ids[-2:]:  # deleted before the sweep seeds their page
        orch.delete_image("s1", image_id)
    _settle(orch, pub, providers)
    done = orch.get_batch("s1", batch["id"])
    assert done["status"] == "completed", done
    assert done["counts"] == {"succeeded": 4} and done["total"] == 4 and done["progress"] == 1.0, done


def test_images_deleted_after_they_were_seeded_leave_an_exact_completed_batch(engine, settings):
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(3)]
    batch, hints = orch.create_batch("s1", all=True)
    pub.publish(hints)
    assert orch.get_batch("s1", batch["id"])["status"] == "running"
    orch.delete_image("s1", ids[0])  # its job (and the batch item) cascade away
    _settle(orch, pub, providers)
    done = orch.get_batch("s1", batch["id"])
    assert done["status"] == "completed", done
    assert done["counts"] == {"succeeded": 2} and done["total"] == 2 and done["progress"] == 1.0, done
