"""Asynchronous agent completion (``MEMEFLOW_AGENT_ASYNC_COMPLETION=on``, app/worker/run.py
``_Completer``) under real Celery workers: every job ends with one paid call per image; an agent
worker SIGKILLed with completions still queued loses nothing and repeats no call (the lease
recovery adopts the recorded results); a warm shutdown commits the queued completions first.

The completions are held in the queue by the test itself: it keeps its images ``FOR SHARE`` in an
open transaction, so the agent completion's ``FOR UPDATE`` of the images waits while the calls go
on (claims and the visual lane's completions take no conflicting lock)."""

from __future__ import annotations

import contextlib
import signal

import pytest
from sqlalchemy import text

from app.orchestrator.hints import Hint
from tests.conftest import poll_until
from tests.integration.conftest import Sweeper, wait_jobs_terminal
from tests.integration.test_celery_runtime import (
    assert_each_stage_once,
    calls_by_stage,
    counting,
    ingest_many,
    make_orch,
)

pytestmark = pytest.mark.slow

# the counting agent is not a local one (`local` would not apply)
ASYNC = {"MEMEFLOW_AGENT_ASYNC_COMPLETION": "on"}


def _setup(cluster) -> None:
    """Counting providers; every process plans and runs the agent lane as for a local agent's
    threads worker: one call per hint (every agent task hinted on its own), no slot limit below
    the threads."""
    counting(cluster, agent_batch_size=1, agent_lane_limit=0)
    cluster.extra_env.update(MEMEFLOW_AGENT_BATCH_SIZE="1", MEMEFLOW_AGENT_LANE_LIMIT="0")


def _agent_worker(cluster, **env):
    return cluster.worker("agent", pool="threads", concurrency=2, prefetch=2, **ASYNC, **env)


def _count(engine, sql: str) -> int:
    with engine.connect() as c:
        return c.execute(text(sql)).scalar_one()


@contextlib.contextmanager
def images_held(engine):
    """Every image held FOR SHARE until the block ends: agent completions wait, nothing else does."""
    conn = engine.connect()
    tx = conn.begin()
    try:
        conn.execute(text("SELECT id FROM images FOR SHARE")).all()
        yield
    finally:
        tx.rollback()
        conn.close()


def _ready_for_agent(cluster, engine, orch, publisher, n: int, first: int):
    """``n`` jobs ingested, their visual stage done and their agent tasks queued (no agent worker yet)."""
    cluster.worker("visual")
    cluster.worker("embedding")
    job_ids = ingest_many(orch, cluster.settings, publisher, range(first, first + n))
    poll_until(lambda: _count(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'queued'") == n,
               timeout=60, what=f"{n} agent tasks queued")
    # a hint of its own for each (a wake-up group's other members are otherwise hinted by the
    # completions, which the test holds back)
    with engine.connect() as c:
        ids = c.execute(text("SELECT id FROM tasks WHERE lane = 'agent' AND status = 'queued'")).scalars().all()
    publisher.publish([Hint("agent", task_id) for task_id in ids])
    return job_ids


def _agent_worker_with_calls_made(cluster, engine, call_log, n: int):
    """An agent worker started while the images are held: once all ``n`` calls are made, every
    task is still running (made, none committed: the completions wait in the process)."""
    agent = _agent_worker(cluster)
    poll_until(lambda: sum(calls_by_stage(call_log)["agent"].values()) == n, timeout=60,
               what="every agent call made")
    assert _count(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'running'") == n
    return agent


def test_every_job_finishes_with_one_paid_call_each_with_asynchronous_completion(cluster, engine, publisher, call_log):
    _setup(cluster)
    orch = make_orch(engine, cluster.settings)
    cluster.worker("visual")
    cluster.worker("embedding")
    _agent_worker(cluster)
    job_ids = ingest_many(orch, cluster.settings, publisher, range(60))

    counts = wait_jobs_terminal(engine, job_ids, timeout=120)

    assert counts == {"succeeded": 60}
    assert_each_stage_once(call_log, 60)
    assert _count(engine, "SELECT count(*) FROM task_attempts WHERE state <> 'completed'") == 0
    assert not list(cluster.settings.agent_results_path.rglob("*.json"))  # every landed record discarded


def test_an_agent_worker_killed_with_completions_queued_loses_nothing_and_calls_nothing_twice(
    cluster, engine, publisher, call_log
):
    n = 6  # 2 call threads: one completion blocked in the thread, 4 queued, the rest blocked in submit
    _setup(cluster)
    orch = make_orch(engine, cluster.settings)
    job_ids = _ready_for_agent(cluster, engine, orch, publisher, n, first=200)
    with images_held(engine):
        agent = _agent_worker_with_calls_made(cluster, engine, call_log, n)
        assert len(list(cluster.settings.agent_results_path.rglob("*.json"))) == n
        cluster.kill(agent, signal.SIGKILL)
    with Sweeper(orch, publisher, cluster.settings.sweep_interval_s) as sweeper:
        _agent_worker(cluster)
        counts = wait_jobs_terminal(engine, job_ids, timeout=90)
    assert not sweeper.errors

    assert counts == {"succeeded": n}  # every recorded result adopted
    agent_calls = calls_by_stage(call_log)["agent"]
    assert len(agent_calls) == n and set(agent_calls.values()) == {1}, agent_calls  # no paid call repeated
    assert _count(engine, "SELECT count(*) FROM task_attempts") == n  # no second attempt either
    assert _count(engine, "SELECT count(*) FROM task_attempts WHERE state = 'completed'") == n


def test_a_warm_shutdown_commits_the_queued_completions_before_the_worker_exits(cluster, engine, publisher, call_log):
    n = 4
    _setup(cluster)
    orch = make_orch(engine, cluster.settings)
    job_ids = _ready_for_agent(cluster, engine, orch, publisher, n, first=300)
    with images_held(engine):
        agent = _agent_worker_with_calls_made(cluster, engine, call_log, n)
        agent.popen.send_signal(signal.SIGTERM)
        poll_until(lambda: "queued agent completions to commit" in agent.log() or not agent.alive, timeout=30,
                   what="the warm shutdown waiting for the queued completions")
        assert agent.alive, "the worker exited with its completions still queued"
    # the images released: the draining worker commits every queued completion, then exits
    agent.popen.wait(timeout=60)
    assert _count(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'succeeded'") == n
    counts = wait_jobs_terminal(engine, job_ids, timeout=60)  # no sweep ran: nothing needed recovering
    assert counts == {"succeeded": n}
    assert sum(calls_by_stage(call_log)["agent"].values()) == n
