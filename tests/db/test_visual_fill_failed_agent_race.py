"""A visual fill seeds an image whose context is still coming (its agent under way in its own job):
the fill's item follows that job. Should the agent fail between the fill's page scan and the image's
lock in the same seeding transaction, the fill must not make an explicit job of its own for it — that
job would re-run (pay for) the failed agent, which a model change never does (store/serving.py NEEDS).
The failure commits on another connection, in another thread, exactly inside that window."""

from __future__ import annotations

import threading

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.store import serving_fill
from app.stages.errors import PermanentError
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.conftest import poll_until
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.textmodels import VISUAL_SPEC_B


def _waiting_image(engine, settings):
    """Two processed images and one whose agent (after its visual stage) waits for a retry."""
    clock, pub = FakeClock(), RecordingPublisher()
    old, old_providers = Orchestrator(engine, settings, clock=clock), Providers(settings)
    for i in range(2):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    for _ in range(3):
        drive(old, pub, old_providers, clock)
    res = store_and_ingest(old, "s1", png_bytes(7))  # its agent waits for a retry, a long backoff
    waiting = res.image["id"]
    pub.publish(res.hints)
    for h in pub.drain():
        if h.lane == "visual":
            handle_hint(old, h.lane, h.task_id, "w", old_providers, pub)
    with engine.begin() as c:
        held = c.execute(text("UPDATE tasks SET available_at = :later WHERE image_id = :i AND stage = 'agent'"
                              " AND status = 'queued' RETURNING id"), {"i": waiting, "later": clock().replace(year=2027)})
        [(agent_task,)] = held.all()
    pub.drain()
    assert rows(engine, "SELECT context_status FROM images WHERE id = :i", i=waiting)[0][0] == "pending"
    return clock, pub, old, waiting, agent_task


def _fail_agent(engine, old, clock, agent_task) -> None:
    """Another worker: the agent call fails for good, committed on its own connections."""
    with engine.begin() as c:
        c.execute(text("UPDATE tasks SET available_at = :now WHERE id = :t"), {"t": agent_task, "now": clock()})
    claim = old.claim_task(agent_task, "agent-worker", "agent")
    assert claim is not None
    old.fail_task(claim, PermanentError("the provider refused the image"))


def _model_change(engine, settings, clock, pub, waiting, failer: list[threading.Thread] | None = None) -> None:
    """Sweeps of the new visual model: the backfill begins, its fill is seeded; workers run its jobs.
    The fill never made a job of its own for the image, whose agent therefore ran once."""
    new_settings = settings.replace(visual_provider=VISUAL_SPEC_B, search_cutover_check_s=0.0)
    new = Orchestrator(engine, new_settings, clock=clock)
    for _ in range(4):
        clock.advance(new_settings.sweep_interval_s + new_settings.rehint_grace_s + 1)
        pub.publish(new.sweep().hints)
    providers = Providers(new_settings)
    for _ in range(3):
        drive(new, pub, providers, clock)
    for t in failer or ():  # the failure committed (after the seeder's, if it waited for it)
        t.join(timeout=60)
        assert not t.is_alive()
    assert rows(engine, "SELECT status FROM processing_jobs WHERE image_id = :i ORDER BY revision", i=waiting) == [
        ("failed",)], "the fill made a job that runs the failed agent again"
    assert rows(engine, "SELECT count(*) FROM tasks WHERE image_id = :i AND stage = 'agent'", i=waiting)[0][0] == 1


def test_an_agent_failing_while_a_fill_page_is_seeded_is_not_run_again_by_the_fill(engine, settings, monkeypatch):
    clock, pub, old, waiting, agent_task = _waiting_image(engine, settings)
    original = serving_fill.fill_page_txn
    failed = threading.Event()

    def agent_fails_after_the_scan(*args, **kwargs):
        page = original(*args, **kwargs)
        if not failed.is_set() and any(str(r["id"]) == str(waiting) for r in page[0]):
            failed.set()

            def fail_it():
                _fail_agent(engine, old, clock, agent_task)

            t = threading.Thread(target=fail_it)
            t.start()
            t.join(timeout=60)
            assert not t.is_alive()
        return page

    monkeypatch.setattr(serving_fill, "fill_page_txn", agent_fails_after_the_scan)
    _model_change(engine, settings, clock, pub, waiting)
    assert failed.is_set(), "the fill never scanned the waiting image"


def test_an_agent_failing_just_after_the_fill_looked_again_is_not_run_again_by_the_fill(engine, settings, monkeypatch):
    """The same failure one statement later: after the seeder's look under the image lock, before it
    reads the image's job. The failing worker does not take the image lock; it must wait for the
    seeder (which then follows the job) or have ended the job before the seeder looked."""
    clock, pub, old, waiting, agent_task = _waiting_image(engine, settings)
    original = serving_fill.needs_fill_txn
    started = threading.Event()
    failer: list[threading.Thread] = []

    def agent_fails_after_the_look(conn, scope_id, image_id, models):
        needs = original(conn, scope_id, image_id, models)
        if str(image_id) == str(waiting) and not started.is_set():
            started.set()
            t = threading.Thread(target=_fail_agent, args=(engine, old, clock, agent_task))
            t.start()
            failer.append(t)

            def failed_or_waiting():  # the failure committed, or it waits for a lock this seeder holds
                if not t.is_alive():
                    return True
                with engine.connect() as c:
                    return c.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'")).scalar() > 0

            poll_until(failed_or_waiting, timeout=60, what="the agent failure to commit or wait")
        return needs

    monkeypatch.setattr(serving_fill, "needs_fill_txn", agent_fails_after_the_look)
    try:
        _model_change(engine, settings, clock, pub, waiting, failer)
    finally:
        for t in failer:
            t.join(timeout=60)
    assert started.is_set(), "the fill never looked at the waiting image"
