"""Asynchronous agent completion (``MEMEFLOW_AGENT_ASYNC_COMPLETION``, app/worker/run.py
``_Completer``): an agent call thread hands its finished batch's terminal writes to the process's
completion thread and returns. The completion commits what the synchronous path commits, a
fencing loss while queued is discarded and counted the same way, the claims' heartbeat runs until
the job starts, the bounded queue blocks instead of dropping, and a shutdown drains it."""

from __future__ import annotations

import contextlib
import threading

import pytest
from sqlalchemy import text

from app import metrics
from app.config import Settings, SettingsError
from app.orchestrator import Orchestrator, RecordingPublisher
from app.worker import run, tasks
from tests.conftest import poll_until
from tests.support.agents import CountingAgent, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


@pytest.fixture()
def completer(monkeypatch):
    """A fresh completion thread for the test (the module's is per process)."""
    c = run._Completer()
    monkeypatch.setattr(run, "_completer", c)
    yield c
    assert c.drain(30), "a completion job of the test never ended"


class Gate:
    """A job that holds the completion thread until released (what a slow commit would do)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        assert self.release.wait(30), "the gate was never released"


@contextlib.contextmanager
def completion_thread_held(completer):
    """The completion thread busy with a Gate for the block: whatever is handed to it waits."""
    gate = Gate()
    completer.submit(gate)
    assert gate.entered.wait(10)
    try:
        yield
    finally:
        gate.release.set()


def _to_agent_hint(orch, providers, pub, seed: int, scope: str = "local"):
    pub.publish(store_and_ingest(orch, scope, png_bytes(seed)).hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    return hint


def _task(engine, task_id):
    with engine.connect() as c:
        return c.execute(text("SELECT * FROM tasks WHERE id = :t"), {"t": task_id}).mappings().one()


def _snapshot(engine, task_id) -> dict:
    """What a completion wrote for an agent task, without the ids and times that differ per run."""
    t = _task(engine, task_id)
    with engine.connect() as c:
        attempts = c.execute(text("SELECT state, result IS NOT NULL FROM task_attempts WHERE task_id = :t"),
                             {"t": task_id}).all()
        stages = c.execute(text("SELECT stage, status, attempt_count FROM job_stages WHERE job_id = :j ORDER BY stage"),
                           {"j": t["job_id"]}).all()
        job = c.execute(text("SELECT status FROM processing_jobs WHERE id = :j"), {"j": t["job_id"]}).scalar_one()
        image = c.execute(text("SELECT context IS NOT NULL, context_status FROM images WHERE id = :i"),
                          {"i": t["image_id"]}).one()
        lanes = c.execute(text("SELECT lane, status, claim_generation FROM tasks WHERE job_id = :j ORDER BY lane"),
                          {"j": t["job_id"]}).all()
        slots = c.execute(text("SELECT count(*) FROM lane_slots WHERE task_id = :t"), {"t": task_id}).scalar_one()
    return {
        "status": t["status"], "lease": t["lease_expires_at"], "attempt_count": t["attempt_count"],
        "error": t["error"], "result_keys": sorted(t["result"] or {}), "attempts": sorted(tuple(a) for a in attempts),
        "stages": [tuple(s) for s in stages], "job": job, "image": tuple(image), "lanes": [tuple(x) for x in lanes],
        "slots": slots,
    }


def _fenced(operation: str) -> float:
    return metrics.FENCING_REJECTIONS.labels(operation)._value.get()


def _steal(engine, task_id) -> None:
    """Another claim took the task over (its lease lapsed and it was re-claimed)."""
    with engine.begin() as c:
        c.execute(text("UPDATE tasks SET lease_owner = 'thief', claim_generation = claim_generation + 1 WHERE id = :t"),
                  {"t": task_id})


# ------------------------------------------------------------------------------ the setting
@pytest.mark.parametrize("raw", ["off", "local", "on"])
def test_the_setting_reads_off_local_and_on(raw):
    assert Settings.from_env({"MEMEFLOW_AGENT_ASYNC_COMPLETION": raw}).agent_async_completion == raw


@pytest.mark.parametrize("raw", ["yes", "1", "ON", "remote", ""])
def test_any_other_value_is_rejected_by_name(raw):
    with pytest.raises(SettingsError, match="MEMEFLOW_AGENT_ASYNC_COMPLETION must be 'off', 'local' or 'on'"):
        Settings.from_env({"MEMEFLOW_AGENT_ASYNC_COMPLETION": raw})


def test_the_default_is_off_and_local_applies_to_a_local_agent_only():
    assert Settings().agent_async_completion == "off" and not Settings().agent_completes_async
    local, paid = {"agent_provider": "local-ocr"}, {"agent_provider": "openai-compatible"}
    assert Settings(agent_async_completion="local", **local).agent_completes_async
    assert not Settings(agent_async_completion="local", **paid).agent_completes_async
    assert Settings(agent_async_completion="on", **paid).agent_completes_async
    assert not Settings(agent_async_completion="off", **local).agent_completes_async


def test_on_with_a_remote_agent_needs_its_lookup():
    """Finished paid results queued for commit are adopted after a kill only through the lookup."""
    remote = {"MEMEFLOW_AGENT_PROVIDER": "openai-compatible", "MEMEFLOW_AGENT_ASYNC_COMPLETION": "on"}
    with pytest.raises(SettingsError, match="needs MEMEFLOW_AGENT_LOOKUP_URL"):
        Settings.from_env(remote)
    looked_up = Settings.from_env({**remote, "MEMEFLOW_AGENT_LOOKUP_URL": "http://127.0.0.1:9/lookup"})
    assert looked_up.agent_completes_async
    assert Settings.from_env({**remote, "MEMEFLOW_AGENT_ASYNC_COMPLETION": "off"}).agent_provider == "openai-compatible"


def test_local_leaves_a_paid_agents_completion_synchronous(engine, settings, completer):
    s = settings.replace(agent_async_completion="local")  # the test agent is not a local one
    assert not s.agent_is_local
    orch = Orchestrator(engine, s)
    providers, pub = providers_with(s, CountingAgent(results_dir=str(s.agent_results_path))), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, 900)
    with completion_thread_held(completer):  # a completion thread that would hold any job handed to it
        assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
        assert _task(engine, hint.task_id)["status"] == "succeeded"  # committed before the call returned
        assert completer.pending == 1  # the gate alone: nothing was handed over


# ------------------------------------------------------------------------------ the completion
def test_an_asynchronous_completion_commits_what_the_synchronous_one_does(engine, settings, completer):
    root = settings.agent_results_path
    agent = CountingAgent(results_dir=str(root))
    out = {}
    for mode, seed in (("off", 910), ("on", 911)):
        s = settings.replace(agent_async_completion=mode)
        orch = Orchestrator(engine, s)
        providers, pub = providers_with(s, agent), RecordingPublisher()
        hint = _to_agent_hint(orch, providers, pub, seed, scope=f"tenant-{mode}")
        before = len(pub.published)
        assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
        assert completer.drain(30)
        hints = [h.lane for h in pub.published[before:]]
        out[mode] = (_snapshot(engine, hint.task_id), hints)
    assert out["on"] == out["off"]
    snap, hints = out["on"]
    assert snap["status"] == "succeeded" and snap["attempts"] == [("completed", True)] and snap["slots"] == 0
    assert "embedding" in hints  # the next stage's hint was published by the completion thread
    assert agent.calls["describe"] == 2
    assert list(root.rglob("*.json")) == []  # both landed attempts' records discarded


def test_the_call_thread_returns_before_the_commit_and_the_record_is_durable_by_then(engine, settings, completer):
    s = settings.replace(agent_async_completion="on")
    orch = Orchestrator(engine, s)
    root = s.agent_results_path
    providers, pub = providers_with(s, CountingAgent(results_dir=str(root))), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, 920)
    with completion_thread_held(completer):
        assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
        assert _task(engine, hint.task_id)["status"] == "running"  # queued behind the gate
        assert len(list(root.rglob("*.json"))) == 1  # its result record is already written
        [state] = [r[0] for r in rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t", t=hint.task_id)]
        assert state == "external_started"  # what the lease recovery adopts should the process die now
    assert completer.drain(30)
    assert _task(engine, hint.task_id)["status"] == "succeeded"
    assert list(root.rglob("*.json")) == []


def test_a_fencing_loss_while_queued_is_discarded_and_counted_as_the_synchronous_one(engine, settings, completer):
    root = settings.agent_results_path
    agent = CountingAgent(results_dir=str(root))
    kept = {}
    for mode, seed in (("off", 930), ("on", 931)):
        s = settings.replace(agent_async_completion=mode, heartbeat_s=20.0, lease_s=60.0)  # no beat in the test
        orch = Orchestrator(engine, s)
        providers, pub = providers_with(s, agent), RecordingPublisher()
        hint = _to_agent_hint(orch, providers, pub, seed, scope=f"fenced-{mode}")
        before, hints_before = _fenced("complete"), len(pub.published)
        if mode == "off":  # the synchronous path: the takeover happens during the call
            real = agent.describe

            def describe_then_lose(image, *, attempt_id, reverse_image_policy, _real=real, _t=hint.task_id):
                answer = _real(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
                _steal(engine, _t)
                return answer

            agent.describe = describe_then_lose
            try:
                assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
            finally:
                del agent.describe
        else:  # the asynchronous path: the takeover happens while the completion waits in the queue
            with completion_thread_held(completer):
                assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
                _steal(engine, hint.task_id)
            assert completer.drain(30)
        t = _task(engine, hint.task_id)
        assert (t["status"], t["lease_owner"]) == ("running", "thief")  # nothing of the lost claim applied
        assert _fenced("complete") == before + 1
        assert [h.lane for h in pub.published[hints_before:]] == []  # no next-stage hint
        [state] = [r[0] for r in rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t", t=hint.task_id)]
        kept[mode] = state
    assert kept == {"off": "external_started", "on": "external_started"}
    assert len(list(root.rglob("*.json"))) == 2  # each fenced-out attempt keeps its record (adoptable)
    with engine.connect() as c:
        counted = c.execute(text("SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'"))
        assert counted.scalar_one() == 2


def test_the_heartbeat_extends_the_lease_while_the_completion_waits(engine, settings, completer):
    s = settings.replace(agent_async_completion="on", heartbeat_s=0.2, lease_s=30.0)
    orch = Orchestrator(engine, s)
    providers, pub = providers_with(s, CountingAgent(results_dir=str(s.agent_results_path))), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, 940)
    with completion_thread_held(completer):
        assert run.handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
        first = _task(engine, hint.task_id)["lease_expires_at"]
        poll_until(lambda: _task(engine, hint.task_id)["lease_expires_at"] > first, timeout=20,
                   what="the queued claim's lease extended")
        assert _task(engine, hint.task_id)["status"] == "running"
    assert completer.drain(30)
    t = _task(engine, hint.task_id)
    assert t["status"] == "succeeded" and t["lease_expires_at"] is None
    # no beat after the commit: a beat of a finished claim would be counted as a fencing rejection
    with engine.connect() as c:
        rejected = c.execute(text("SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'"))
        assert rejected.scalar_one() == 0


# ------------------------------------------------------------------------------ the queue
def test_a_full_queue_blocks_the_call_thread_and_drops_nothing():
    c = run._Completer(size=1)
    gate, done = Gate(), []
    c.submit(gate)  # running
    assert gate.entered.wait(10)
    c.submit(lambda: done.append(1))  # waiting: the queue is full
    third = threading.Thread(target=c.submit, args=(lambda: done.append(2),))
    third.start()
    third.join(0.3)
    assert third.is_alive(), "a submit to a full queue returned"
    assert done == []
    gate.release.set()
    third.join(10)
    assert not third.is_alive()
    assert c.drain(10)
    assert done == [1, 2]  # every job ran, in order


def test_a_failing_job_is_logged_and_the_thread_goes_on(caplog):
    c = run._Completer()
    done = []
    c.submit(lambda: 1 / 0)
    c.submit(lambda: done.append(1))
    assert c.drain(10)
    assert done == [1]
    assert "an asynchronous agent completion failed" in caplog.text


def test_a_shutdown_drains_the_queue_within_its_bound(monkeypatch):
    c = run._Completer()
    monkeypatch.setattr(run, "_completer", c)
    gate, done = Gate(), []
    c.submit(gate)
    c.submit(lambda: done.append(1))
    assert gate.entered.wait(10)
    assert run.drain_completions(0.2) is False  # bounded: it gives up while a job still runs
    gate.release.set()
    tasks._drain_completions()  # the worker_shutdown / worker_process_shutdown handler
    assert done == [1] and c.pending == 0


def test_the_shutdown_handler_is_connected_to_both_celery_signals():
    from celery import signals

    for signal in (signals.worker_shutdown, signals.worker_process_shutdown):
        assert tasks._drain_completions in signal._live_receivers(None)


def test_a_forked_child_gets_a_completer_of_its_own(monkeypatch):
    for name in ("_completer", "_beater", "_call_pool", "_call_pool_lock"):  # put back after the test
        monkeypatch.setattr(run, name, getattr(run, name))
    parent = run._completer
    run._forget_call_pool()  # what os.register_at_fork runs in the child
    assert run._completer is not parent and run._completer.pending == 0
