"""``batch.progress`` while a batch is still seeding (docs/events.md): a library larger than the
backlog threshold stays ``seeding`` for most of its run (seeding pauses while the scope's backlog
is high and the sweep seeds the next page as it drains), so its items' jobs finish long before the
last page is seeded. A client following the batch on the event stream sees its progress then too,
not only once the last page is in."""

from __future__ import annotations

import dataclasses

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.store import events as q
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


def _progress_events(engine, batch_id: str) -> list[dict]:
    with engine.connect() as c:
        return [dict(r["payload"]) for r in q.events_after_txn(c, "s1", 0, 1000, ["batch.progress"])
                if str(r["batch_id"]) == batch_id]


def test_a_seeding_batch_whose_items_progress_gets_progress_events(engine, settings):
    settings = dataclasses.replace(settings, batch_page_size=2, batch_backlog_threshold=0)
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    for i in range(8):
        store_and_ingest(orch, "s1", png_bytes(i), process=False)
    batch, hints = orch.create_batch("s1", all=True, first_page_size=2)
    pub.publish(hints)
    _run_all(orch, pub, providers)  # the first page's jobs all succeed
    pub.publish(orch.sweep().hints)  # seeds the next page (the backlog drained) and pauses again
    current = orch.get_batch("s1", batch["id"])
    assert current["status"] == "seeding" and current["counts"] == {"succeeded": 2, "queued": 2}, current
    progress = _progress_events(engine, batch["id"])
    assert progress and progress[-1]["status"] == "seeding", progress
    assert progress[-1]["counts"] == {"succeeded": 2, "queued": 2} and progress[-1]["total"] == 8
    assert progress[-1]["progress"] == 0.25
    _run_all(orch, pub, providers)
    pub.publish(orch.sweep().hints)  # counts changed: one more event
    assert _progress_events(engine, batch["id"])[-1]["counts"] == {"succeeded": 4, "queued": 2}
    n = len(_progress_events(engine, batch["id"]))
    orch.sweep()  # paused (its page is queued), nothing changed: no event
    assert len(_progress_events(engine, batch["id"])) == n
