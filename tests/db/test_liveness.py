"""Liveness in the database: the worker registry (upsert, TTL, prune, clean deregistration) and
the last completed sweep with its lane-gauge snapshot (SPEC §10 "Sweep")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator.liveness import (
    WorkerIdentity,
    deregister_worker,
    read_liveness,
    register_worker,
    worker_ttl_s,
)
from app.orchestrator.store import sweep as sweep_q
from app.orchestrator.store import workers as q
from tests.support.pipeline import png_bytes, store_and_ingest


def _worker(node: str, *lanes: str, pid: int = 4242) -> WorkerIdentity:
    return WorkerIdentity(node=node, lanes=lanes, started_at=datetime.now(UTC), host="h1", pid=pid)


def _db_now(engine) -> datetime:
    with engine.connect() as conn:
        return q.db_now(conn)


def test_registered_workers_count_per_lane_until_their_ttl_passes(engine, settings):
    register_worker(engine, _worker("visual@h1", "visual", "maintenance"))
    register_worker(engine, _worker("visual-2@h1", "visual", "maintenance"))
    register_worker(engine, _worker("agent@h1", "agent", "maintenance"))
    ttl = worker_ttl_s(settings)
    assert ttl == 3 * settings.worker_registry_interval_s
    with engine.connect() as conn:
        now = q.db_now(conn)
        assert q.live_workers_per_lane(conn, ttl) == {"visual": 2, "agent": 1, "maintenance": 3}
        # just inside the TTL: still live; just past it: gone from every count
        assert q.live_workers_per_lane(conn, ttl, now + timedelta(seconds=ttl - 1))["visual"] == 2
        assert q.live_workers_per_lane(conn, ttl, now + timedelta(seconds=ttl + 1)) == {}
        rows = q.live_workers(conn, ttl)
    assert [(r["node"], r["host"], r["pid"], r["lanes"]) for r in rows] == [
        ("agent@h1", "h1", 4242, ["agent", "maintenance"]),
        ("visual-2@h1", "h1", 4242, ["maintenance", "visual"]),
        ("visual@h1", "h1", 4242, ["maintenance", "visual"]),
    ]


def test_a_heartbeat_refreshes_last_seen_and_a_restarted_node_replaces_its_row(engine, settings):
    old = _worker("agent@h1", "agent", pid=100)
    with engine.begin() as conn:  # registered long ago: expired
        q.upsert_worker_txn(conn, node=old.node, host=old.host, pid=old.pid, lanes=old.lanes,
                            started_at=old.started_at, now=_db_now(engine) - timedelta(hours=1))
    assert read_liveness(engine, settings).lanes["agent"].workers == 0
    register_worker(engine, _worker("agent@h1", "agent", pid=200))  # the same node name, a new process
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT pid FROM worker_registry")).scalars().all()
    assert rows == [200]
    assert read_liveness(engine, settings).lanes["agent"].workers == 1


def test_clean_shutdown_deregisters_only_its_own_process(engine, settings):
    register_worker(engine, _worker("embedding@h1", "embedding", pid=300))
    assert deregister_worker(engine, _worker("embedding@h1", "embedding", pid=299)) is False  # an older process
    assert read_liveness(engine, settings).lanes["embedding"].workers == 1
    assert deregister_worker(engine, _worker("embedding@h1", "embedding", pid=300)) is True
    assert read_liveness(engine, settings).lanes["embedding"].workers == 0


def test_the_sweep_prunes_expired_registrations_and_records_its_completion(engine, settings):
    orch = Orchestrator(engine, settings)
    dead = _worker("visual@dead", "visual", "maintenance")
    with engine.begin() as conn:
        q.upsert_worker_txn(conn, node=dead.node, host=dead.host, pid=dead.pid, lanes=dead.lanes,
                            started_at=dead.started_at,
                            now=_db_now(engine) - timedelta(seconds=worker_ttl_s(settings) + 5))
    register_worker(engine, _worker("visual@alive", "visual", "maintenance"))
    store_and_ingest(orch, "local", png_bytes(1))
    store_and_ingest(orch, "local", png_bytes(2))
    with engine.connect() as conn:
        assert sweep_q.sweep_state(conn) is None  # no sweep yet
    before = _db_now(engine)
    report = orch.sweep()
    assert report.counts["workers_pruned"] == 1
    with engine.connect() as conn:
        nodes = conn.execute(text("SELECT node FROM worker_registry")).scalars().all()
        state = sweep_q.sweep_state(conn)
    assert nodes == ["visual@alive"]
    assert state["last_success_at"] >= before and state["duration_s"] >= 0
    assert state["lane_gauges"]["visual"]["queued"] == 2  # the snapshot /metrics serves
    assert state["lane_gauges"]["agent"] == {"queued": 0, "running": 0, "oldest_age": 0.0}


def test_a_skipped_sweep_records_nothing(engine, settings):
    orch = Orchestrator(engine, settings)
    with engine.connect() as other:
        assert sweep_q.try_lock(other)
        assert orch.sweep().skipped
        sweep_q.unlock(other)
        other.commit()
    with engine.connect() as conn:
        assert sweep_q.sweep_state(conn) is None


def test_liveness_flags_a_lane_with_queued_work_and_no_live_worker(engine, settings):
    orch = Orchestrator(engine, settings.replace(sweep_interval_s=60.0))
    settings = orch.settings
    orch.sweep()
    live = read_liveness(engine, settings)
    assert not live.sweep_stale and live.reasons == []  # nothing queued, nothing missing
    store_and_ingest(orch, "local", png_bytes(3))  # a queued visual task, and no worker at all
    live = read_liveness(engine, settings)
    assert live.lanes["visual"].unserved and not live.lanes["agent"].unserved
    assert [r["code"] for r in live.reasons] == ["lane_unserved"]
    assert "visual" in live.reasons[0]["message"]
    register_worker(engine, _worker("visual@h1", "visual", "maintenance"))
    assert read_liveness(engine, settings).reasons == []


def test_liveness_flags_webhook_deliveries_due_with_no_webhooks_worker(engine, settings):
    """A subscription with an event after its cursor is the webhooks lane's queued work: without a
    live worker on that queue nothing would ever deliver it, so /readyz and /ops say so."""
    from app.orchestrator.store import events as events_q

    orch = Orchestrator(engine, settings.replace(sweep_interval_s=60.0, webhook_allowed_networks="127.0.0.0/8"))
    settings = orch.settings
    orch.sweep()
    orch.create_webhook("local", "http://127.0.0.1:9/hook", ["image.deleted"])
    with engine.begin() as conn:
        events_q.stage_event_txn(conn, "local", "batch.progress", {"n": 1})  # not a type it takes
    assert not read_liveness(engine, settings).lanes["webhooks"].queued
    with engine.begin() as conn:
        events_q.stage_event_txn(conn, "local", "image.deleted", {"image_id": None})
    live = read_liveness(engine, settings)
    assert live.lanes["webhooks"].unserved
    assert [r["message"] for r in live.reasons] == ["lane webhooks has queued work and no live worker"]
    register_worker(engine, _worker("webhooks@h1", "webhooks", "maintenance"))
    assert read_liveness(engine, settings).reasons == []
