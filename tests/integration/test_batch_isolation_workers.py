"""A real Celery visual worker whose model crashes on one poisoned image: only that image's task
is charged (and, being retryable, retried until it is exhausted); every other task of its
batch — another scope's too — succeeds on its first attempt with no error text."""

from __future__ import annotations

from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.conftest import poll_until
from tests.integration.conftest import Sweeper
from tests.support import poison
from tests.support.pipeline import png_bytes, store_and_ingest


def test_a_worker_charges_only_the_poisoned_image_of_a_mixed_scope_batch(engine, it_settings, cluster, publisher,
                                                                       call_log):
    settings = it_settings.replace(visual_provider="tests.support.poison:PoisonBatchVisual", max_attempts=3)
    cluster.settings = settings
    orch = Orchestrator(engine, settings)
    for scope, seed, size in [("tenant-a", 1, (48, 40)), ("tenant-a", 2, (poison.POISON_WIDTH, 40)),
                              ("tenant-a", 3, (48, 40)), ("tenant-b", 4, (48, 40)), ("tenant-b", 5, (48, 40))]:
        publisher.publish(store_and_ingest(orch, scope, png_bytes(seed, size)).hints)
    cluster.worker("visual", MEMEFLOW_MAX_ATTEMPTS="3")
    with Sweeper(orch, publisher, interval=0.3):  # re-hints the poisoned task's retries (beat's job)
        rows = poll_until(lambda: _terminal_visual_tasks(engine, 5), timeout=90, what="visual tasks terminal")
    bad = [r for r in rows if r["width"] == poison.POISON_WIDTH]
    good = [r for r in rows if r["width"] != poison.POISON_WIDTH]
    assert [(r["status"], r["attempt_count"], r["error"]) for r in good] == [("succeeded", 1, None)] * 4
    assert {r["scope_id"] for r in good} == {"tenant-a", "tenant-b"}
    assert [(r["status"], r["attempt_count"]) for r in bad] == [("failed", 3)]
    assert bad[0]["error"]["message"] == "the stage failed unexpectedly; the worker's log has the details"
    calls = poison.read_call_log(call_log)
    lane, sizes, ok = calls[0]  # one batch of both scopes, crashed as a whole
    assert (lane, sorted(sizes), ok) == ("visual", [1920] * 4 + [poison.POISON_WIDTH * 40], False)
    assert sum(len(sizes) for _, sizes, ok in calls if ok) == 4  # each healthy image embedded once


def _terminal_visual_tasks(engine, n: int):
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.scope_id, t.status, t.attempt_count, t.error, i.width FROM tasks t"
            " JOIN images i ON i.id = t.image_id WHERE t.lane = 'visual' AND t.status IN ('succeeded', 'failed')"
        )).mappings().all()
    return rows if len(rows) == n else None
