"""The watchdog (app/worker/watchdog.py), in process: a provider call still in flight past its lane's
``run_max_s`` stops its claims' heartbeat, notes ``stage_timeout`` on the task (fenced, the task
left running for the recovery) and ends the process — here a stand-in that records the exit code;
a call that returns in time, or an unwatched one, changes nothing. Real workers:
tests/integration/test_hung_provider_workers.py."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.worker import run, watchdog
from tests.conftest import poll_until
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


@pytest.fixture()
def exits(monkeypatch):
    """The codes ``end_process`` was called with (the process is not ended)."""
    codes: list[int] = []
    ended = threading.Event()

    def fake_end(code: int) -> None:
        codes.append(code)
        ended.set()

    monkeypatch.setattr(watchdog, "end_process", fake_end)
    # the note is asserted on: under load it may take longer than a real exit would wait for it
    monkeypatch.setattr(watchdog, "NOTE_TIMEOUT_S", 60.0)
    codes_ended = (codes, ended)
    return codes_ended


def _task(engine, task_id):
    with engine.connect() as c:
        return c.execute(text("SELECT status, lease_expires_at, error FROM tasks WHERE id = :t"),
                         {"t": task_id}).mappings().one()


def _claim(orch, seed):
    claim = orch.claim_task(visual_task(store_and_ingest(orch, "local", png_bytes(seed))).task_id, "w1")
    assert claim is not None
    return claim


def test_a_call_past_its_maximum_stops_the_beats_notes_the_task_and_ends_the_process(engine, settings, exits):
    codes, ended = exits
    orch = Orchestrator(engine, settings.replace(heartbeat_s=0.2, lease_s=30, visual_run_max_s=0.5))
    claim = _claim(orch, 7300)
    with run.Heartbeat(orch, [claim]) as hb, watchdog.computing_for(hb):
        with watchdog.provider_call("visual", object()):
            assert ended.wait(20), "the watchdog never ended the process"
        after = _task(engine, claim.task_id)
        threading.Event().wait(0.6)  # three heartbeat periods: no beat extends the lease any more
        assert _task(engine, claim.task_id)["lease_expires_at"] == after["lease_expires_at"]
    assert codes == [watchdog.STAGE_TIMEOUT_EXIT]
    assert after["status"] == "running"  # the recovery's to end, as after any worker death
    assert after["error"]["code"] == "stage_timeout"
    assert "0.5 s" in after["error"]["message"]


def test_a_call_that_returns_in_time_or_runs_unwatched_changes_nothing(engine, settings, exits):
    codes, _ = exits
    orch = Orchestrator(engine, settings.replace(heartbeat_s=0.2, lease_s=30, visual_run_max_s=30,
                                                 embedding_run_max_s=0))
    claim = _claim(orch, 7400)
    first = _task(engine, claim.task_id)["lease_expires_at"]
    with run.Heartbeat(orch, [claim]) as hb, watchdog.computing_for(hb):
        with watchdog.provider_call("visual", object()):
            pass
        assert hb.calls == {}
        with watchdog.provider_call("embedding", object()):  # 0: no limit, never armed
            assert hb.calls == {}
        poll_until(lambda: _task(engine, claim.task_id)["lease_expires_at"] > first, timeout=20,
                   what="the lease still extended")
    with watchdog.provider_call("visual", object()):  # outside a claim's compute: unwatched
        pass
    assert codes == []
    assert _task(engine, claim.task_id)["error"] is None


def test_a_task_ended_after_its_last_run_overran_says_so(engine, settings):
    """The sweep ends a visual task whose attempts are spent ``max_attempts_exceeded``; the watchdog's
    ``stage_timeout`` note is kept in its message, so an operator sees why the runs died."""
    orch = Orchestrator(engine, settings.replace(max_attempts=1))
    claim = _claim(orch, 7500)
    orch.note_overrun([claim], {"code": "stage_timeout", "message": "ran past its maximum"})
    with engine.begin() as c:  # the worker was ended: its lease lapses
        c.execute(text("UPDATE tasks SET lease_expires_at = now() - interval '1 minute', last_hint_at = NULL"
                       " WHERE id = :t"), {"t": claim.task_id})
    orch.sweep()
    task = _task(engine, claim.task_id)
    assert task["status"] == "failed" and task["error"]["code"] == "max_attempts_exceeded"
    assert "stage_timeout" in task["error"]["message"], task["error"]


class _HangsOnFirstCall:
    """Wraps an agent: its first describe parks until released (a model hung on one input); every
    other call answers at once."""

    def __init__(self, agent) -> None:
        self.agent, self.release, self.hung = agent, threading.Event(), []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.agent, name)

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        with self._lock:
            first = not self.hung
            if first:
                self.hung.append(attempt_id)
        if first:
            assert self.release.wait(120)
        return self.agent.describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


def test_in_an_agent_batch_only_the_call_that_overran_is_noted(engine, settings, exits):
    """An agent batch's calls run side by side, each its own claim's: when one hangs, the watchdog
    ends the process for all of them, but only the hung call's task and attempt say
    ``stage_timeout`` — a batch-mate still computing or done was no timeout of its own (its
    recovery would otherwise close its attempt ``stage_timeout`` and its task's final message blame
    it)."""
    import dataclasses

    from app.orchestrator import RecordingPublisher
    from app.worker.run import handle_hint
    from tests.support.agents import CountingAgent, providers_with, step

    codes, ended = exits
    s = dataclasses.replace(settings, agent_batch_size=2, agent_lane_limit=8, heartbeat_s=0.2, lease_s=30,
                            agent_run_max_s=0.5)
    orch = Orchestrator(engine, s)
    agent = _HangsOnFirstCall(CountingAgent(results_dir=str(s.agent_results_path)))
    providers, pub = providers_with(s, agent), RecordingPublisher()
    for seed in (7600, 7601):
        pub.publish(store_and_ingest(orch, "tenant-w", png_bytes(seed)).hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    runner = threading.Thread(target=handle_hint, args=(orch, "agent", hint.task_id, "w1", providers, pub))
    runner.start()
    try:
        assert ended.wait(30), "the watchdog never ended the process"
        with engine.connect() as c:
            noted = {r.attempt_id: (r.task_error, r.attempt_error) for r in c.execute(text(
                "SELECT a.attempt_id, t.error->>'code' AS task_error, a.error->>'code' AS attempt_error"
                " FROM task_attempts a JOIN tasks t ON t.id = a.task_id")).all()}
    finally:
        agent.release.set()
        runner.join(60)
    assert codes == [watchdog.STAGE_TIMEOUT_EXIT]
    assert len(noted) == 2, noted  # one batch of two calls
    [hung] = agent.hung
    assert noted[hung] == ("stage_timeout", "stage_timeout")
    assert [v for k, v in noted.items() if k != hung] == [(None, None)]
