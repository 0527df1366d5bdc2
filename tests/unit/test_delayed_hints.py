"""Delayed hints (a retry's wake-up at the end of its backoff), without a broker: how they are
sent, that a worker never continues one itself, and the bound that keeps them under the Redis
transport's visibility timeout."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from app.orchestrator.hints import Hint, RecordingPublisher

ETA = datetime(2030, 1, 1, 12, 0, 2, tzinfo=timezone.utc)


class _App:
    def __init__(self):
        self.sent = []

    def send_task(self, name, args, queue, routing_key, retry, **options):
        self.sent.append((name, args, queue, options))


def test_a_delayed_hint_is_sent_with_its_eta_and_a_plain_one_without():
    from app.publisher import CeleryHintPublisher

    app, now, later = _App(), uuid.uuid4(), uuid.uuid4()
    CeleryHintPublisher(app).publish([Hint("visual", now), Hint("agent", later, eta=ETA)])
    assert app.sent == [("memeflow.run_visual", [str(now)], "visual", {}),
                        ("memeflow.run_agent", [str(later)], "agent", {"eta": ETA})]


def test_a_worker_never_keeps_a_delayed_hint_to_run_itself():
    """A kept hint is claimed at once (run.LocalHints): a delayed one would find its task not due
    yet, claim nothing and be spent, leaving the task to the sweep — so it goes to the broker."""
    from app.worker.run import LocalHints

    broker = RecordingPublisher()
    local = LocalHints(broker, {"visual"}, limit=8)
    delayed, plain = Hint("visual", uuid.uuid4(), eta=ETA), Hint("visual", uuid.uuid4())
    local.publish([delayed, plain])
    assert local.take() == plain
    assert broker.published == [delayed]


def test_the_recording_publisher_keeps_each_hints_eta():
    pub = RecordingPublisher()
    pub.publish([Hint("visual", uuid.uuid4(), eta=ETA)])
    assert [h.eta for h in pub.published] == [ETA] and pub.take().eta == ETA


def test_the_delayed_hint_bound_stays_within_half_the_brokers_visibility_timeout():
    """An eta message is held unacknowledged by the worker that received it until it runs; the Redis
    transport delivers a message again once it is unacknowledged longer than its visibility
    timeout. Half of it leaves the other half for the run itself."""
    import celeryconfig
    from app.config import DELAYED_HINT_MAX_BOUND_S, Settings, SettingsError

    assert 2 * DELAYED_HINT_MAX_BOUND_S <= celeryconfig.broker_transport_options["visibility_timeout"]
    assert Settings().delayed_hint_max_s <= DELAYED_HINT_MAX_BOUND_S
    assert Settings(delayed_hint_max_s=0.0).delayed_hint_max_s == 0.0  # off
    for bad in (-1.0, DELAYED_HINT_MAX_BOUND_S + 1):
        with pytest.raises(SettingsError):
            Settings(delayed_hint_max_s=bad).validate()
    assert Settings.from_env({"MEMEFLOW_DELAYED_HINT_MAX_S": "90"}).delayed_hint_max_s == 90.0


def test_the_worker_keeps_an_eta_a_delayed_hint_may_carry_and_drops_any_other():
    """app/worker/strategy.py: a retry's delayed hint (at most DELAYED_HINT_MAX_BOUND_S ahead) runs
    at its eta; an eta that does not parse, has no zone, or lies beyond that bound is dropped."""
    from datetime import UTC, datetime, timedelta

    from app.config import DELAYED_HINT_MAX_BOUND_S
    from app.worker.strategy import eta_refused

    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert not eta_refused((now + timedelta(seconds=2)).isoformat(), now)
    assert not eta_refused((now + timedelta(seconds=DELAYED_HINT_MAX_BOUND_S)).isoformat(), now)
    assert not eta_refused((now - timedelta(hours=1)).isoformat(), now)  # due already: runs now
    assert eta_refused((now + timedelta(seconds=DELAYED_HINT_MAX_BOUND_S + 120)).isoformat(), now)
    assert eta_refused("2999-01-01T00:00:00+00:00", now)
    assert eta_refused("not a date", now)
    assert eta_refused("2026-12-07T12:00:05", now)  # no zone: not what memeflow sends
