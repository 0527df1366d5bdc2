"""The transactional outbox: an event exists iff its change committed, and a cursor never skips
one (ids of a scope are drawn in commit order)."""

from __future__ import annotations

import random
import threading
import time
import uuid

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.store import events as q
from app.stages.errors import PermanentError
from tests.conftest import poll_until
from tests.support.pipeline import Workers, png_bytes, store_and_ingest


def _events(engine, scope: str = "local") -> list[dict]:
    with engine.connect() as c:
        return [dict(r) for r in q.events_after_txn(c, scope, 0, 1000)]


def test_a_succeeded_job_writes_one_event_with_image_and_status(engine, settings):
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(1), display_name="one")
    pub.publish(res.hints)
    with Workers(orch, pub, n=1):
        poll_until(lambda: orch.get_job("local", res.job["id"])["status"] == "succeeded", what="job done")
    evs = _events(engine)
    assert [e["type"] for e in evs] == ["job.succeeded"]
    e = evs[0]
    assert str(e["job_id"]) == res.job["id"] and str(e["image_id"]) == res.image["id"]
    assert e["payload"]["status"] == "succeeded" and e["payload"]["image_id"] == res.image["id"]
    with engine.connect() as c:  # the staging table never keeps a committed row
        assert c.execute(text("SELECT count(*) FROM event_pending")).scalar() == 0


def test_rolled_back_change_leaves_no_event_and_committed_one_does(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(2))
    job_id = res.job["id"]
    upd = text("UPDATE processing_jobs SET status = 'failed', error = '{\"code\": \"x\"}' WHERE id = :j")
    with engine.connect() as c:
        c.execute(upd, {"j": job_id})
        c.rollback()
    with engine.connect() as c:  # a savepoint rolled back inside a committed transaction
        with c.begin():
            sp = c.begin_nested()
            c.execute(upd, {"j": job_id})
            sp.rollback()
    assert _events(engine) == []
    with engine.begin() as c:
        c.execute(upd, {"j": job_id})
    evs = _events(engine)
    assert [(e["type"], str(e["job_id"])) for e in evs] == [("job.failed", job_id)]
    assert evs[0]["payload"]["error"] == {"code": "x"}


def test_failed_job_and_deleted_image_events(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(3))
    claim = orch.claim_task(res.job["stages"][0]["task_id"], "w1")
    assert claim is not None
    orch.fail_task(claim, PermanentError("broken image", code="invalid_image"))
    orch.delete_image("local", uuid.UUID(res.image["id"]))
    evs = _events(engine)
    assert [e["type"] for e in evs] == ["job.failed", "image.deleted"]
    assert evs[0]["payload"]["error"]["code"] == "invalid_image"
    assert str(evs[1]["image_id"]) == res.image["id"]
    assert evs[0]["id"] < evs[1]["id"]


def test_events_are_scoped(engine, settings):
    orch = Orchestrator(engine, settings)
    a = store_and_ingest(orch, "alpha", png_bytes(4))
    b = store_and_ingest(orch, "beta", png_bytes(5))
    orch.delete_image("alpha", uuid.UUID(a.image["id"]))
    orch.delete_image("beta", uuid.UUID(b.image["id"]))
    assert [str(e["image_id"]) for e in _events(engine, "alpha")] == [a.image["id"]]
    assert [str(e["image_id"]) for e in _events(engine, "beta")] == [b.image["id"]]


def test_batch_progress_and_completed_events(engine, settings):
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()
    for i in range(3):
        store_and_ingest(orch, "local", png_bytes(10 + i), process=False)
    batch, hints = orch.create_batch("local", all=True)
    pub.publish(hints)
    orch.sweep()  # seeded and running, nothing done yet: a first progress event
    with Workers(orch, pub, n=2):
        poll_until(lambda: orch.get_batch("local", batch["id"])["counts"].get("succeeded") == 3, what="items done")
    orch.sweep()
    evs = _events(engine)
    types = [e["type"] for e in evs]
    assert types.count("job.succeeded") == 3 and types[-1] == "batch.completed"
    done = evs[-1]
    assert str(done["batch_id"]) == batch["id"] and done["payload"]["counts"] == {"succeeded": 3}
    assert all(str(e["batch_id"]) == batch["id"] for e in evs if e["type"].startswith("job."))
    progress = [e for e in evs if e["type"] == "batch.progress"]
    assert progress and progress[0]["payload"]["total"] == 3
    orch.sweep()  # nothing changed: no new event
    assert len(_events(engine)) == len(evs)


def test_a_cursor_never_skips_an_event_that_commits_late(engine, settings):
    """Writers hold their transactions open for random times after staging, so a global sequence
    drawn at insert would commit out of order; ids drawn at commit make every reader's cursor safe."""
    orch = Orchestrator(engine, settings)
    orch.ensure_scope("local")
    n_writers, per_writer = 6, 15
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(per_writer):
                with engine.begin() as c:
                    q.stage_event_txn(c, "local", "batch.progress", {"w": seed})
                    time.sleep(rnd.random() * 0.02)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def read() -> None:
        cursor = 0
        while True:
            writers_done = stop.is_set()  # read before the query: an empty answer after it is final
            with engine.connect() as c:
                rows = q.events_after_txn(c, "local", cursor, 100)
            for r in rows:
                seen.append(r["id"])
                cursor = r["id"]
            if writers_done and not rows:
                return

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(i,)) for i in range(n_writers)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join(timeout=30)
    assert not errors
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert sorted(seen) == [e["id"] for e in _events(engine)] and len(seen) == n_writers * per_writer


def test_transactions_touching_several_scopes_in_opposite_orders_do_not_deadlock(engine, settings):
    orch = Orchestrator(engine, settings)
    for s in ("a", "b", "c"):
        orch.ensure_scope(s)
    errors: list[BaseException] = []

    def write(order: tuple[str, ...]) -> None:
        try:
            for _ in range(30):
                with engine.begin() as c:
                    for s in order:
                        q.stage_event_txn(c, s, "batch.progress", {})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(o,)) for o in (("a", "b", "c"), ("c", "b", "a"), ("b", "a", "c"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in ("a", "b", "c"):
        assert len(_events(engine, s)) == 90


def _pending_scans(engine) -> int:
    """Scans of ``event_pending`` other than primary-key probes (sequential, or by ``txid``), once
    every session's statistics are flushed."""
    with engine.connect() as c:
        c.execute(text("SELECT pg_stat_clear_snapshot()"))
        return c.execute(text(
            "SELECT coalesce(t.seq_scan, 0) + coalesce(i.idx_scan, 0) FROM pg_stat_user_tables t"
            " LEFT JOIN pg_stat_user_indexes i ON i.relid = t.relid AND i.indexrelname = 'ix_event_pending_txid'"
            " WHERE t.relname = 'event_pending'")).scalar_one()


def test_a_commit_of_many_events_reads_the_staged_rows_once(engine, settings):
    """The commit-time step fires once per staged event; the first firing moves them all, and each
    later one looked them up again by txid (O(N²) while holding the scope's event lock: 8,000 events
    took 7.5 s). A firing whose row is gone now returns at once (migration 0027)."""
    Orchestrator(engine, settings).ensure_scope("local")
    n = 200
    with engine.connect() as c:  # this session's earlier statistics reach the shared view first
        c.execute(text("SELECT pg_stat_force_next_flush()"))
        c.commit()
    before = _pending_scans(engine)
    with engine.connect() as c:
        c.execute(text("INSERT INTO event_pending (scope_id, type, payload)"
                       " SELECT 'local', 'job.succeeded', jsonb_build_object('n', g) FROM generate_series(1, :n) g"),
                  {"n": n})
        c.commit()  # the staged rows move to events here
        c.execute(text("SELECT pg_stat_force_next_flush()"))
        c.commit()
    assert [e["payload"]["n"] for e in _events(engine)] == list(range(1, n + 1))
    scans = poll_until(lambda: (_pending_scans(engine) - before) or None, what="the commit's statistics")
    assert scans <= 5, scans  # the first firing's few, not a few per event


def test_every_terminal_job_status_writes_its_event(engine, settings):
    """A job that ends cancelled, superseded or target_changed is told too (docs/events.md): a client
    following a job by events or webhooks must see it end, whatever the way it ended."""
    import hashlib

    from app.orchestrator import webhooks

    orch = Orchestrator(engine, settings)
    cancelled = store_and_ingest(orch, "local", png_bytes(40))
    orch.cancel_job("local", cancelled.job["id"])
    superseded = store_and_ingest(orch, "local", png_bytes(41))
    edited = orch.edit_context("local", superseded.image["id"], display_name="renamed")
    replaced = store_and_ingest(orch, "local", png_bytes(42))
    new_bytes = png_bytes(43)
    sha = hashlib.sha256(new_bytes).hexdigest()
    ns = orch.ensure_scope("local")
    (settings.storage_path / f"{ns}/{sha}.png").write_bytes(new_bytes)
    orch.replace_content("local", replaced.image["id"], sha256=sha, media_type="image/png", extension=".png",
                         size_bytes=len(new_bytes), width=48, height=40, storage_key=f"{ns}/{sha}.png")
    evs = {str(e["job_id"]): e for e in _events(engine) if e["type"].startswith("job.")}
    for res, status, code in ((cancelled, "cancelled", "cancelled"), (superseded, "superseded", "superseded"),
                              (replaced, "target_changed", "target_changed")):
        job = orch.get_job("local", res.job["id"])
        assert job["status"] == status
        e = evs[res.job["id"]]
        assert e["type"] == f"job.{status}" and str(e["image_id"]) == res.image["id"]
        assert e["payload"]["status"] == status and e["payload"]["error"]["code"] == code
        assert e["payload"]["completed_at"] is not None
    assert edited.job["id"] != superseded.job["id"] and edited.job["id"] not in evs  # the new one is active
    # a webhook may ask for them
    assert {"job.cancelled", "job.superseded", "job.target_changed"} <= set(webhooks.ALL_TYPES)
