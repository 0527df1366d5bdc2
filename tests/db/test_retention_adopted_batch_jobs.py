"""Retention never takes a batch's item away from a batch still running (or ended within the
age). A batch over a library already processed adopts each image's latest job — ended long ago —
as its item's job (``batch_items.job_id``; its ``batch_id`` is not the batch's). Once a newer job of
the image appears (a context edit while the batch runs), that old job was "ended, replaced, old
enough" and the job step deleted it, and the FK cascade deleted the batch item with it: the image
dropped out of the batch's counts and, at completion, out of its total."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.db.test_retention import AGES, _image, _job


def _batch(conn, image: uuid.UUID, status: str, days: float) -> uuid.UUID:
    """A batch of this one image, its page seeded (a seeding one finishes seeding at the sweep)."""
    return conn.execute(text(
        "INSERT INTO batches (id, scope_id, status, select_all, requested_ids, seed_cursor, reverse_image_policy,"
        " total, updated_at) VALUES (gen_random_uuid(), 'local', :st, false, ARRAY[CAST(:i AS uuid)],"
        " '{\"offset\": 1}', 'forbid', 1, now() - make_interval(secs => :age)) RETURNING id"),
        {"st": status, "i": image, "age": days * 86400.0}).scalar_one()


def _item(conn, batch: uuid.UUID, image: uuid.UUID, job: uuid.UUID) -> None:
    conn.execute(text("INSERT INTO batch_items (batch_id, image_id, scope_id, job_id) VALUES (:b, :i, 'local', :j)"),
                 {"b": batch, "i": image, "j": job})


def test_a_job_a_live_batch_adopted_stays_while_the_batch_needs_it(engine, settings):
    orch = Orchestrator(engine, settings.replace(**AGES))
    orch.ensure_scope("local")
    with engine.begin() as conn:
        adopted = {}
        for name, (status, days) in {"running": ("running", 0), "seeding": ("seeding", 0),
                                     "ended_recently": ("completed", 1), "ended_long_ago": ("cancelled", 40)}.items():
            img = _image(conn, name.ljust(64, "0"))
            old = _job(conn, img, 1, "succeeded", 40)  # what the batch adopted, ended 40 days ago
            _job(conn, img, 2, "succeeded", 0)  # a newer revision (a context edit meanwhile)
            batch = _batch(conn, img, status, days)
            _item(conn, batch, img, old)
            adopted[name] = (batch, old)
    report = orch.sweep()
    assert report.counts["retention_errors"] == 0
    with engine.connect() as conn:
        jobs = set(conn.execute(text("SELECT id FROM processing_jobs")).scalars())
        items = {b: n for b, n in conn.execute(text("SELECT batch_id, count(*) FROM batch_items GROUP BY 1"))}
    for name in ("running", "seeding", "ended_recently"):
        batch, old = adopted[name]
        assert old in jobs and items.get(batch) == 1, name
    batch, old = adopted["ended_long_ago"]
    assert old not in jobs and batch not in items  # history of a batch ended before the age still goes
