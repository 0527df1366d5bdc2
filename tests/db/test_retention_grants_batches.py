"""Retention of operation grants and batches: ended ones older than their age go, in the sweep's
bounded walks; a grant or batch that live work, a human's decision, the quota's day or a search
serving state still needs stays (app/orchestrator/store/retention.py)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, retention
from tests.db.test_retention import AGES, DAY, _attempt, _ids, _image, _job, _task

GRANT_AGES = {**AGES, "retention_grants_s": 30 * DAY}


@pytest.fixture(autouse=True)
def _scope(engine):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('local', gen_random_uuid())"
                          " ON CONFLICT DO NOTHING"))


def _grant(conn, state: str, days: float, task: uuid.UUID | None = None) -> uuid.UUID:
    return conn.execute(text(
        "INSERT INTO operation_grants (id, scope_id, operation, idempotency_key, task_id, state, created_at, updated_at)"
        " VALUES (gen_random_uuid(), 'local', 'analysis.agent', md5(random()::text), :t, :st,"
        " now() - make_interval(secs => :age), now() - make_interval(secs => :age)) RETURNING id"),
        {"t": task, "st": state, "age": days * DAY}).scalar_one()


def _batch(conn, status: str, days: float) -> uuid.UUID:
    return conn.execute(text(
        "INSERT INTO batches (id, scope_id, status, select_all, reverse_image_policy, created_at, updated_at)"
        " VALUES (gen_random_uuid(), 'local', :st, true, 'forbid', now() - make_interval(secs => :age),"
        " now() - make_interval(secs => :age)) RETURNING id"), {"st": status, "age": days * DAY}).scalar_one()


def _item(conn, batch: uuid.UUID, image: uuid.UUID, job: uuid.UUID | None) -> None:
    conn.execute(text("INSERT INTO batch_items (batch_id, image_id, scope_id, job_id) VALUES (:b, :i, 'local', :j)"),
                 {"b": batch, "i": image, "j": job})


def _prune_until_settled(orch: Orchestrator) -> None:
    """Retention passes until one deletes nothing (a batch goes the pass after its last item)."""
    for _ in range(10):
        counts = retention.prune(orch)
        assert counts["retention_errors"] == 0, counts
        if not any(counts[f"pruned_{k}"] for k in ("grants", "batch_items", "batches")):
            return
    raise AssertionError("retention did not settle")


def test_ended_grants_go_and_those_still_needed_stay(engine, settings):
    orch = Orchestrator(engine, settings.replace(**GRANT_AGES))
    with engine.begin() as conn:
        img = _image(conn, "a" * 64)
        ended_job = _job(conn, img, 1, "succeeded", 40)
        waiting_job = _job(conn, _image(conn, "b" * 64), 1, "blocked", 40)
        live_job = _job(conn, _image(conn, "c" * 64), 1, "running", 40)
        ended_task = _task(conn, ended_job, "succeeded", 40)
        gone = {
            "committed, task ended": _grant(conn, "committed", 40, ended_task),
            "released, no task": _grant(conn, "released", 40),
            "committed, task pruned": _grant(conn, "committed", 40, uuid.uuid4()),
        }
        unknown_task = _task(conn, ended_job, "failed", 40)
        _attempt(conn, unknown_task, 1, "unknown_execution", 40)
        kept = {
            "acquired": _grant(conn, "acquired", 40, ended_task),
            "young": _grant(conn, "committed", 10, ended_task),
            "job waits for a human": _grant(conn, "committed", 40, _task(conn, waiting_job, "failed", 40)),
            "task running": _grant(conn, "committed", 40, _task(conn, live_job, "running", 40)),
            "job active": _grant(conn, "released", 40, _task(conn, live_job, "cancelled", 40)),
            "attempt unknown": _grant(conn, "unknown", 40, unknown_task),
        }
    _prune_until_settled(orch)
    with engine.connect() as conn:
        left = _ids(conn, "operation_grants")
    assert left == set(kept.values()), {k for k, g in {**gone, **kept}.items() if (g in left) != (k in kept)}


def test_a_grant_within_the_quota_day_stays_whatever_the_age_setting(engine, settings):
    orch = Orchestrator(engine, settings.replace(**{**GRANT_AGES, "retention_grants_s": 60.0}))
    with engine.begin() as conn:
        today = _grant(conn, "committed", 2 / 24)  # counted by QuotaPolicy for today
        _grant(conn, "committed", 2)  # a day old at least: goes
    _prune_until_settled(orch)
    with engine.connect() as conn:
        assert _ids(conn, "operation_grants") == {today}


def test_grants_are_kept_forever_with_age_zero(engine, settings):
    orch = Orchestrator(engine, settings.replace(**{**GRANT_AGES, "retention_grants_s": 0.0}))
    with engine.begin() as conn:
        grant = _grant(conn, "committed", 400)
    counts = retention.prune(orch)
    assert counts["pruned_grants"] == 0 and "retention_ms_grants" not in counts
    with engine.connect() as conn:
        assert _ids(conn, "operation_grants") == {grant}


def test_ended_batches_go_with_their_items_and_their_jobs_stay(engine, settings):
    orch = Orchestrator(engine, settings.replace(**GRANT_AGES))
    with engine.begin() as conn:
        old = _batch(conn, "completed", 40)
        images = [_image(conn, f"{n}" * 64) for n in range(5)]
        created = _job(conn, images[0], 1, "succeeded", 40, batch=old)  # each image's latest job: kept
        adopted = _job(conn, images[1], 1, "failed", 45)
        _item(conn, old, images[0], created)
        _item(conn, old, images[1], adopted)
        _item(conn, old, images[2], None)
        cancelled = _batch(conn, "cancelled", 40)
        _item(conn, cancelled, images[3], _job(conn, images[3], 1, "cancelled", 40, batch=cancelled))
        kept = {
            "young": _batch(conn, "completed", 10),
            "running": _batch(conn, "running", 40),
            "served": _batch(conn, "completed", 40),
            "its job waits for a human": _batch(conn, "completed", 40),
        }
        waiting = _job(conn, images[4], 1, "blocked", 40, batch=kept["its job waits for a human"])
        _item(conn, kept["its job waits for a human"], images[4], waiting)
        for batch in (kept["young"], kept["running"], kept["served"]):
            _item(conn, batch, images[0], created)
        conn.execute(text(
            "INSERT INTO search_serving (scope_id, kind, state, serving_model, serving_dims, serving_ref, batch_id)"
            " VALUES ('local', 'text', 'pinned', 'm', 3, '{}', :b)"), {"b": kept["served"]})
    jobs_before = _ids_of(engine, "processing_jobs")
    _prune_until_settled(orch)
    with engine.connect() as conn:
        assert _ids(conn, "batches") == set(kept.values())
        items = {tuple(r) for r in conn.execute(text("SELECT batch_id, image_id FROM batch_items"))}
        assert items == {(kept[k], images[0]) for k in ("young", "running", "served")} | {
            (kept["its job waits for a human"], images[4])}
        batch_of = {r[0]: r[1] for r in conn.execute(text("SELECT id, batch_id FROM processing_jobs"))}
    assert set(batch_of) == jobs_before  # no job deleted by the batches' retention
    assert batch_of[created] is None and batch_of[adopted] is None  # the pruned batch is named nowhere
    assert batch_of[waiting] == kept["its job waits for a human"]


def _ids_of(engine, table: str) -> set:
    with engine.connect() as conn:
        return _ids(conn, table)


def test_a_batchs_items_go_a_bounded_step_at_a_time(engine, settings):
    orch = Orchestrator(engine, settings.replace(**GRANT_AGES, retention_batch_size=4, retention_max_batches=2))
    with engine.begin() as conn:
        old = _batch(conn, "completed", 40)
        for n in range(20):
            img = _image(conn, f"{n:064x}")
            _item(conn, old, img, _job(conn, img, 1, "succeeded", 40, batch=old))
    per_pass = []
    for _ in range(10):
        counts = retention.prune(orch)
        per_pass.append(counts["pruned_batch_items"])
        assert counts["pruned_batch_items"] <= 8 and counts["pruned_batches"] <= 1
        if not _ids_of(engine, "batches"):
            break
    assert sum(per_pass) == 20 and not _ids_of(engine, "batches")
