"""The pure liveness decision: when a deployment is degraded, and what it says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.orchestrator.liveness import SERVED_QUEUES, assess

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ALL_SERVED = {"visual": 1, "agent": 2, "embedding": 1, "maintenance": 4}


def _sweep(age_s: float) -> dict:
    return {"last_success_at": NOW - timedelta(seconds=age_s), "duration_s": 0.01, "lane_gauges": {}}


def test_healthy_when_every_lane_with_work_has_a_worker_and_the_sweep_is_recent():
    live = assess(NOW, ALL_SERVED, {"visual", "agent"}, _sweep(44.9), 15.0)
    assert tuple(live.lanes) == SERVED_QUEUES
    assert not live.degraded and live.reasons == []
    assert live.as_dict()["status"] == "ok"


def test_a_sweep_older_than_three_intervals_or_none_at_all_is_stale():
    assert not assess(NOW, ALL_SERVED, set(), _sweep(45.0), 15.0).sweep_stale  # exactly 3x: not yet
    stale = assess(NOW, ALL_SERVED, set(), _sweep(45.5), 15.0)
    assert stale.sweep_stale and [r["code"] for r in stale.reasons] == ["sweep_stale"]
    assert "ago (more than 3x the 15s interval)" in stale.reasons[0]["message"]
    never = assess(NOW, ALL_SERVED, set(), None, 15.0)
    assert never.sweep_stale and never.sweep_age_s is None
    assert never.reasons[0]["message"] == "no reconcile sweep has completed yet"


def test_only_a_lane_with_queued_work_and_no_worker_is_unserved():
    workers = {"visual": 0, "agent": 0, "maintenance": 1}
    live = assess(NOW, workers, {"agent"}, _sweep(1), 15.0)
    assert [name for name, lane in live.lanes.items() if lane.unserved] == ["agent"]  # idle visual is fine
    assert live.reasons == [{"code": "lane_unserved", "message": "lane agent has queued work and no live worker"}]
    assert live.as_dict()["lanes"]["agent"] == {"workers": 0, "queued": True, "unserved": True}


def test_the_status_caption_names_the_last_sweeps_failed_steps():
    from app.cli.status import _sweep_caption

    row = {**_sweep(1), "failed_steps": [{"step": "retention", "error": "OperationalError: x"}]}
    live = assess(NOW, ALL_SERVED, set(), row, 15.0)
    assert live.sweep_failed_steps == row["failed_steps"] and live.as_dict()["sweep"]["failed_steps"] == row["failed_steps"]
    assert "steps failed: retention" in _sweep_caption(live)
    assert "failed" not in _sweep_caption(assess(NOW, ALL_SERVED, set(), _sweep(1), 15.0))
