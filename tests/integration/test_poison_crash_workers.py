"""A real Celery visual worker killed by one image (``os._exit`` in its model call, as a segfault
or an OOM kill would): the first death takes its whole batch of two scopes with it, but the dead
tasks are then run alone — the poisoned image dies alone until its own attempts are spent and ends
``max_attempts_exceeded``, and every batch-mate succeeds on its first charged attempt with no
error text (SPEC §10). The worker is restarted after each death, as its supervisor would."""

from __future__ import annotations

from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.conftest import poll_until
from tests.integration.conftest import Sweeper
from tests.support import poison
from tests.support.pipeline import png_bytes, store_and_ingest

MAX_ATTEMPTS = 2


def test_a_worker_killing_image_dies_alone_and_its_batch_mates_succeed(engine, it_settings, cluster, publisher,
                                                                       call_log):
    settings = it_settings.replace(visual_provider="tests.support.poison:ExitVisual", max_attempts=MAX_ATTEMPTS)
    cluster.settings = settings
    orch = Orchestrator(engine, settings)
    for scope, seed, size in [("tenant-a", 1, (poison.POISON_WIDTH, 40)), ("tenant-a", 2, (48, 40)),
                              ("tenant-b", 3, (48, 40)), ("tenant-b", 4, (48, 40))]:
        publisher.publish(store_and_ingest(orch, scope, png_bytes(seed, size)).hints)
    # not waited for as "ready": the queued poison may kill it before the harness sees it ready
    workers = [cluster.worker("visual", wait=False, MEMEFLOW_MAX_ATTEMPTS=str(MAX_ATTEMPTS))]

    def terminal():
        if not workers[-1].alive:  # died: its supervisor starts another
            workers.append(cluster.worker("visual", wait=False, MEMEFLOW_MAX_ATTEMPTS=str(MAX_ATTEMPTS)))
        return _terminal_visual_tasks(engine, 4)

    with Sweeper(orch, publisher, interval=0.3) as sweeper:  # beat's job: re-hints the dead claims
        rows = poll_until(terminal, timeout=150, interval=0.2, what="visual tasks terminal")
    assert sweeper.errors == []
    calls = poison.read_call_log(call_log)
    crashed = [sizes for _, sizes, ok in calls if not ok]
    assert [len(sizes) for sizes in crashed] == [4] + [1] * MAX_ATTEMPTS  # one batch of both scopes, then alone
    dead = [w for w in workers if not w.alive]
    assert [w.popen.returncode for w in dead] == [70] * (MAX_ATTEMPTS + 1)  # each death was the model call's
    bad = [r for r in rows if r["width"] == poison.POISON_WIDTH]
    good = [r for r in rows if r["width"] != poison.POISON_WIDTH]
    assert [(r["status"], r["attempt_count"], r["error"]["code"]) for r in bad] == [
        ("failed", MAX_ATTEMPTS, "max_attempts_exceeded")]
    assert [(r["status"], r["attempt_count"], r["error"]) for r in good] == [("succeeded", 1, None)] * 3
    assert {r["scope_id"] for r in good} == {"tenant-a", "tenant-b"}
    assert sum(len(sizes) for _, sizes, ok in calls if ok) == 3  # each healthy image embedded once


def _terminal_visual_tasks(engine, n: int):
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.scope_id, t.status, t.attempt_count, t.error, i.width FROM tasks t"
            " JOIN images i ON i.id = t.image_id WHERE t.lane = 'visual' AND t.status IN ('succeeded', 'failed')"
        )).mappings().all()
    return rows if len(rows) == n else None
