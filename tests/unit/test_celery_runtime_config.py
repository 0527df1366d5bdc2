"""Celery configuration and the hint publisher, without a broker."""

from __future__ import annotations

import uuid

from app import metrics
from app.orchestrator.hints import Hint


def test_config_carries_ids_only_with_late_acks_and_no_results():
    import celeryconfig as c

    assert c.task_serializer == "json" and c.accept_content == ["json"]
    assert c.task_acks_late is True and c.task_reject_on_worker_lost is True
    assert c.worker_prefetch_multiplier == 1
    assert c.task_ignore_result is True and c.result_backend is None
    assert {q.name for q in c.task_queues} == {"visual", "agent", "embedding", "webhooks", "maintenance"}
    for lane, name in c.HINT_TASKS.items():
        assert c.task_routes[name]["queue"] == lane
    assert c.beat_schedule["reconcile-sweep"]["task"] == c.SWEEP_TASK
    assert c.beat_schedule["reconcile-sweep"]["options"]["expires"] >= c.SWEEP_EXPIRES_MIN_S
    # per-scope HNSW index maintenance: its own beat entry on the maintenance queue (not a sweep step)
    assert c.beat_schedule["search-indexes"]["task"] == c.SEARCH_INDEXES_TASK
    assert c.task_routes[c.SEARCH_INDEXES_TASK]["queue"] == c.MAINTENANCE
    assert c.worker_hijack_root_logger is False


def test_tasks_are_registered_under_their_lane_names():
    import celeryconfig as c
    from app.worker.celery_app import celery_app

    for name in (*c.HINT_TASKS.values(), c.SWEEP_TASK, c.SEED_BATCH_TASK, c.SEARCH_INDEXES_TASK):
        assert name in celery_app.tasks


class _App:
    def __init__(self, fail: bool = False):
        self.fail, self.sent = fail, []

    def send_task(self, name, args, queue, routing_key, retry):
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((name, args, queue, retry))


def _failures(lane: str) -> float:
    return metrics.HINT_PUBLISH_FAILURES.labels(lane=lane)._value.get()


def test_publisher_sends_the_task_id_only_on_the_lane_queue_without_retries():
    from app.publisher import CeleryHintPublisher

    app = _App()
    tid = uuid.uuid4()
    CeleryHintPublisher(app).publish([Hint("agent", tid)])
    assert app.sent == [("memeflow.run_agent", [str(tid)], "agent", False)]


def test_publisher_never_raises_counts_failures_and_cools_down():
    from app.publisher import CeleryHintPublisher

    now = [100.0]
    app = _App(fail=True)
    pub = CeleryHintPublisher(app, cooldown_s=1.0, clock=lambda: now[0])
    before = _failures("visual")
    pub.publish([Hint("visual", uuid.uuid4()) for _ in range(3)])  # first fails, rest dropped
    assert _failures("visual") - before == 3
    app.fail = False
    pub.publish([Hint("visual", uuid.uuid4())])  # still cooling down: dropped, not sent
    assert app.sent == [] and _failures("visual") - before == 4
    now[0] += 1.5
    pub.publish([Hint("visual", uuid.uuid4())])
    assert len(app.sent) == 1


def test_unknown_lane_is_counted_not_sent():
    from app.publisher import CeleryHintPublisher

    app = _App()
    before = _failures("bogus")
    CeleryHintPublisher(app).publish([Hint("bogus", uuid.uuid4())])
    assert app.sent == [] and _failures("bogus") - before == 1


def test_settings_env_round_trips_through_from_env(tmp_path):
    from app.cli.processes import settings_env
    from app.config import Settings

    s = Settings(var_dir=tmp_path, lease_s=2.5, heartbeat_s=0.5, log_json=False, broker_url="redis://x:1/3")
    assert Settings.from_env(settings_env(s)) == s


def test_a_worker_stops_continuing_hints_when_shutting_down_or_when_deliveries_wait(monkeypatch):
    from celery.worker import state

    from app.worker import tasks

    class Req:  # WeakSet members
        pass

    monkeypatch.setattr(state, "should_stop", None)
    monkeypatch.setattr(state, "should_terminate", None)
    running = Req()
    monkeypatch.setattr(state, "reserved_requests", {running})
    monkeypatch.setattr(state, "active_requests", {running})
    assert not tasks._stop_continuing()
    monkeypatch.setattr(state, "should_stop", 0)  # a warm shutdown's exit code EX_OK is 0
    assert tasks._stop_continuing()
    monkeypatch.setattr(state, "should_stop", None)
    waiting = Req()
    monkeypatch.setattr(state, "reserved_requests", {running, waiting})
    assert tasks._stop_continuing()


class _Hub:
    def __init__(self):
        self.soon, self.later = [], []

    def call_soon(self, callback):
        self.soon.append(callback)

    def call_later(self, delay, callback):
        self.later.append((delay, callback))


class _Dispatcher:
    def __init__(self):
        self.flushes = 0

    def flush(self):
        self.flushes += 1


def _consumer():
    from vine import promise

    from app.worker.consumer import Consumer

    c = Consumer.__new__(Consumer)  # the event-buffer logic only (a real one needs a worker)
    c.hub, c.event_dispatcher = _Hub(), _Dispatcher()
    c._schedule_flush_promise = promise(c._schedule_events_flush)
    return c


def test_workers_use_the_consumer_that_batches_task_events():
    import celeryconfig as c

    assert c.worker_consumer == "app.worker.consumer:Consumer"


def test_buffered_task_events_are_flushed_once_per_window(monkeypatch):
    from app.worker import consumer as mod

    now = [100.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])
    c = _consumer()
    for _ in range(6):  # a burst of events (three per task): one flush scheduled, not one per event
        c.on_send_event_buffered()
    assert len(c.hub.soon) == 1 and c.event_dispatcher.flushes == 0
    c.hub.soon.pop()()  # the loop thread schedules the flush on its timer
    (delay, flush), = c.hub.later
    assert delay == mod.EVENTS_FLUSH_S
    now[0] += 0.3
    c.on_send_event_buffered()  # within the window: goes with the scheduled flush
    assert c.hub.soon == []
    now[0] += 0.2
    flush()
    assert c.event_dispatcher.flushes == 1
    c.on_send_event_buffered()  # the next event after a flush schedules the next one
    assert len(c.hub.soon) == 1


def test_a_lost_flush_timer_does_not_stop_the_events(monkeypatch):
    from app.worker import consumer as mod

    now = [100.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])
    c = _consumer()
    c.on_send_event_buffered()
    c.hub.soon.clear()  # its timer never fires (e.g. the loop restarted with the connection)
    now[0] += 2 * mod.EVENTS_FLUSH_S + 0.01
    c.on_send_event_buffered()
    assert len(c.hub.soon) == 1


def test_shutdown_flushes_the_buffered_events(monkeypatch):
    from celery.worker.consumer import Consumer as CeleryConsumer

    c = _consumer()
    monkeypatch.setattr(CeleryConsumer, "shutdown", lambda self: None)
    c.shutdown()
    assert c.event_dispatcher.flushes == 1
