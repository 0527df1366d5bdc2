"""A worker host whose clock is skewed against PostgreSQL's (app/orchestrator/clock.py).

Leases, backoff and due times are written by one process and compared by another, so each
orchestrator's ``now`` is the database's clock, not its host's: a worker 10 minutes ahead cannot
take a live lease from its holder, and one 10 minutes behind still claims due tasks. The host's
skew is simulated by moving what the orchestrator reads as its wall clock.
"""

from __future__ import annotations

import importlib
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

SKEW = timedelta(minutes=10)


def _skew_host(monkeypatch, by: timedelta) -> None:
    """This process's wall clock reads ``by`` off from here on (every place an orchestrator reads it)."""
    def skewed() -> datetime:
        return datetime.now(timezone.utc) + by

    monkeypatch.setattr("app.orchestrator.service.utcnow", skewed)
    try:
        importlib.import_module("app.orchestrator.clock")
    except ImportError:  # before the database clock existed
        return
    monkeypatch.setattr("app.orchestrator.clock.wall_clock", skewed)


@pytest.fixture()
def lease_settings(settings):
    return settings.replace(lease_s=120.0)


def test_a_worker_whose_clock_runs_ahead_cannot_take_a_live_lease(engine, lease_settings, monkeypatch):
    honest = Orchestrator(engine, lease_settings)
    res = store_and_ingest(honest, "local", png_bytes(61))
    task_id = visual_task(res).task_id
    holder = honest.claim_task(task_id, "holder")
    assert holder is not None
    honest.now()  # its reading is taken before the skew

    _skew_host(monkeypatch, SKEW)
    ahead = Orchestrator(engine, lease_settings)
    assert ahead.claim_task(task_id, "thief") is None  # the lease has two minutes left on the database's clock
    assert honest.heartbeat(holder)  # the holder is not fenced out
    with engine.connect() as conn:
        owner, generation = conn.execute(text("SELECT lease_owner, claim_generation FROM tasks WHERE id = :t"),
                                         {"t": task_id}).one()
    assert (owner, generation) == ("holder", holder.generation)


def test_a_worker_whose_clock_runs_behind_claims_due_tasks(engine, lease_settings, monkeypatch):
    honest = Orchestrator(engine, lease_settings)
    res = store_and_ingest(honest, "local", png_bytes(62))
    task_id = visual_task(res).task_id

    _skew_host(monkeypatch, -SKEW)
    behind = Orchestrator(engine, lease_settings)
    claim = behind.claim_task(task_id, "late")
    assert claim is not None  # due now on the database's clock
    with engine.connect() as conn:
        expires, db_now = conn.execute(text("SELECT lease_expires_at, now() FROM tasks WHERE id = :t"),
                                       {"t": task_id}).one()
    # its lease runs lease_s from the database's now, not from ten minutes ago (already lapsed)
    assert timedelta(seconds=100) < expires - db_now <= timedelta(seconds=121)


def test_a_backoff_written_by_a_worker_ahead_is_due_on_the_database_clock(engine, lease_settings, monkeypatch):
    from app.stages.errors import RetryableError

    honest = Orchestrator(engine, lease_settings)
    res = store_and_ingest(honest, "local", png_bytes(63))
    task_id = visual_task(res).task_id
    honest.now()

    _skew_host(monkeypatch, SKEW)
    ahead = Orchestrator(engine, lease_settings)
    claim = ahead.claim_task(task_id, "ahead")
    ahead.fail_task(claim, RetryableError("flaky", code="flaky"))
    with engine.connect() as conn:
        wait = conn.execute(text("SELECT available_at - now() FROM tasks WHERE id = :t"), {"t": task_id}).scalar_one()
    # backoff_max_s is 0.5 s: not ten minutes from now
    assert wait <= timedelta(seconds=lease_settings.backoff_max_s + 1)
