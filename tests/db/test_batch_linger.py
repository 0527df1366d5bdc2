"""A batched lane's linger (``Settings.<lane>_batch_linger_ms``, app/worker/run.py): a worker whose
previous batch of the lane ended less than the linger ago waits out the rest before it claims, so
the tasks that became due meanwhile are claimed in one batch; an idle lane claims at once."""

from __future__ import annotations

import dataclasses
import time

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker import run
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _ingest(orch, seed, scope="local"):
    return visual_task(store_and_ingest(orch, scope, png_bytes(seed)))


def test_a_busy_lane_waits_and_claims_what_became_due_meanwhile_in_one_batch(engine, settings, monkeypatch):
    settings = dataclasses.replace(settings, visual_batch_linger_ms=500.0)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    monkeypatch.setattr(run, "_BATCH_ENDED", {})
    first = _ingest(orch, 40)
    assert run.handle_hint(orch, "visual", first.task_id, "w1", providers, pub, lingers=True) == 1  # idle lane: no wait
    second = _ingest(orch, 41)
    waited: list[float] = []

    def sleep(seconds: float) -> None:  # "meanwhile": another upload becomes due
        waited.append(seconds)
        _ingest(orch, 42)

    monkeypatch.setattr(run.time, "sleep", sleep)
    assert run.handle_hint(orch, "visual", second.task_id, "w1", providers, pub, lingers=True) == 2
    assert len(waited) == 1 and 0 < waited[0] <= 0.5


def test_an_idle_lane_claims_at_once_and_no_linger_means_no_wait(engine, settings, monkeypatch):
    orch = Orchestrator(engine, dataclasses.replace(settings, visual_batch_linger_ms=500.0))
    providers, pub = Providers(settings), RecordingPublisher()
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    # the previous batch ended longer ago than the linger: the lane was idle
    monkeypatch.setattr(run, "_BATCH_ENDED", {"visual": time.monotonic() - 0.6})
    assert run.handle_hint(orch, "visual", _ingest(orch, 43).task_id, "w1", providers, pub, lingers=True) == 1
    assert slept == []
    # no linger configured: never waits, however recent the last batch
    plain = Orchestrator(engine, dataclasses.replace(settings, visual_batch_linger_ms=0.0))
    assert run.handle_hint(plain, "visual", _ingest(orch, 44).task_id, "w1", providers, pub, lingers=True) == 1
    assert slept == []


def test_a_worker_serving_other_lanes_too_never_lingers(engine, settings, monkeypatch):
    # a worker of several lanes would hold up the others' work while it waits: only a dedicated one lingers
    orch = Orchestrator(engine, dataclasses.replace(settings, visual_batch_linger_ms=500.0))
    providers, pub = Providers(settings), RecordingPublisher()
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"visual": time.monotonic()})
    assert run.handle_hint(orch, "visual", _ingest(orch, 45).task_id, "w1", providers, pub) == 1
    assert slept == []
