"""A connection that breaks between COMMIT and its reply (SPEC §4.5, docs/architecture.md): the
worker's retry runs against the committed state and must recognise its own work — an agent claim
whose paid call was never made runs now, a completion that landed counts as landed."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone

from sqlalchemy.exc import OperationalError

from app.orchestrator import Orchestrator, RecordingPublisher
from app.worker import executor
from tests.support.agents import Clock, CountingAgent, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def _disconnect() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"),
                            connection_invalidated=True)


class LoseNextCommitReply:
    """Proxy of an engine: the next ``begin()`` block commits, then raises the disconnect error a
    worker sees when the connection breaks before the COMMIT's reply arrives."""

    def __init__(self, engine):
        self._engine, self.armed = engine, True

    def __getattr__(self, name):
        return getattr(self._engine, name)

    @contextlib.contextmanager
    def begin(self):
        with self._engine.begin() as conn:
            yield conn
        if self.armed:  # committed
            self.armed = False
            raise _disconnect()


class BreakNextTransaction(LoseNextCommitReply):
    """The next ``begin()`` block rolls back on a broken connection: nothing of it commits."""

    @contextlib.contextmanager
    def begin(self):
        with self._engine.begin() as conn:
            yield conn
            if self.armed:
                self.armed = False
                raise _disconnect()


@contextlib.contextmanager
def through(orch, proxy):
    engine, orch.engine = orch.engine, proxy
    try:
        yield
    finally:
        orch.engine = engine


def _setup(engine, settings, seed):
    """An ingested image whose visual stage ran: its agent task's hint is next."""
    orch = Orchestrator(engine, settings, clock=Clock(T0))  # orch.now is the clock
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(seed))
    pub.publish(res.hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    return orch, agent, providers, pub, res, hint


def _attempts(engine, task_id):
    return rows(engine, "SELECT attempt_id, state, claim_generation FROM task_attempts WHERE task_id = :t", t=task_id)


def _fencing_rejections(engine):
    return rows(engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'")[0][0]


def _run_to_end(orch, providers, pub, claims):
    """Make the claims' paid calls, complete them and drain the pipeline."""
    landed: list = []
    pub.publish(orch.complete_tasks([(c, executor.execute_agent(orch.settings, providers, c)) for c in claims], landed))
    assert landed == claims
    assert step(orch, providers, pub) is None


def test_agent_batch_claim_whose_reply_was_lost_runs_its_own_claim_once(engine, settings):
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 1)

    with through(orch, LoseNextCommitReply(engine)):
        claims = orch.claim_agent_batch(hint.task_id, 1, "worker-a")

    [(attempt_id, state, generation)] = _attempts(engine, hint.task_id)
    assert [(c.task_id, c.attempt_id, c.generation, c.recovering) for c in claims] == [
        (hint.task_id, attempt_id, generation, False)]
    assert state == "external_started" and agent.calls["describe"] == 0
    _run_to_end(orch, providers, pub, claims)
    assert agent.calls["describe"] == 1
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded"


def test_single_agent_claim_whose_reply_was_lost_runs_its_own_claim_once(engine, settings):
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 2)

    with through(orch, LoseNextCommitReply(engine)):
        claim = orch.claim_task(hint.task_id, "worker-a")

    [(attempt_id, _, generation)] = _attempts(engine, hint.task_id)
    assert claim is not None and (claim.attempt_id, claim.generation, claim.recovering) == (attempt_id, generation, False)
    _run_to_end(orch, providers, pub, [claim])
    assert agent.calls["describe"] == 1
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded"


def test_a_resumed_claim_gets_a_fresh_lease(engine, settings):
    """The reconnect took most of the lease: the resume renews it in the statement that finds the
    claim, so another worker's recovery cannot end it unknown_execution before the call."""
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 5)

    class SlowReconnect(LoseNextCommitReply):
        """``LoseNextCommitReply``, and the reconnect takes all but a second of the lease."""

        @contextlib.contextmanager
        def begin(self):
            try:
                with super().begin() as conn:
                    yield conn
            except OperationalError:
                orch.now.advance(seconds=settings.lease_s - 1)
                raise

    proxy = SlowReconnect(engine)
    with through(orch, proxy):
        claim = orch.claim_task(hint.task_id, "worker-a")
    assert claim is not None
    [(until,)] = rows(engine, "SELECT lease_expires_at FROM tasks WHERE id = :t", t=hint.task_id)
    assert until == orch.now() + timedelta(seconds=settings.lease_s)


def test_agent_claim_rolled_back_by_a_broken_connection_is_claimed_again(engine, settings):
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 3)

    with through(orch, BreakNextTransaction(engine)):
        claims = orch.claim_agent_batch(hint.task_id, 1, "worker-a")

    [(attempt_id, state, generation)] = _attempts(engine, hint.task_id)  # the retry's, alone
    assert [(c.attempt_id, c.generation) for c in claims] == [(attempt_id, generation)] and state == "external_started"
    _run_to_end(orch, providers, pub, claims)
    assert agent.calls["describe"] == 1


def test_agent_claim_of_another_owner_is_not_taken_for_ours(engine, settings):
    """The lookup is by the attempt ids this call drew: another worker's committed claim of the
    same task is not adopted, and the retry claims nothing."""
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 4)
    assert orch.claim_agent_batch(hint.task_id, 1, "worker-b")

    with through(orch, BreakNextTransaction(engine)):
        assert orch.claim_agent_batch(hint.task_id, 1, "worker-a") == []
    assert rows(engine, "SELECT lease_owner FROM tasks WHERE id = :t", t=hint.task_id) == [("worker-b",)]


def test_completion_whose_reply_was_lost_lands_once_with_its_hints(engine, settings):
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 5)
    claim = orch.claim_task(hint.task_id, "worker-a")
    artifact = executor.execute_agent(settings, providers, claim)

    landed: list = []
    with through(orch, LoseNextCommitReply(engine)):
        hints = orch.complete_tasks([(claim, artifact)], landed)

    assert rows(engine, "SELECT t.status, a.state FROM tasks t JOIN task_attempts a ON a.task_id = t.id"
                        " WHERE t.id = :t", t=claim.task_id) == [("succeeded", "completed")]  # applied once
    assert landed == [claim] and _fencing_rejections(engine) == 0
    [(text_task, lane)] = rows(engine, "SELECT id, lane FROM tasks WHERE job_id = :j AND stage = 'text_embedding'",
                               j=res.job["id"])
    assert [(h.task_id, h.lane) for h in hints] == [(text_task, lane)]
    pub.publish(hints)
    assert step(orch, providers, pub) is None
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded" and agent.calls["describe"] == 1


def test_completion_fenced_out_is_still_a_rejection(engine, settings):
    """Recognising a landed completion needs this very execution to have finished the task so: a
    claim whose lease another worker took is rejected as before."""
    orch, agent, providers, pub, res, hint = _setup(engine, settings, 6)
    claim = orch.claim_task(hint.task_id, "worker-a")
    artifact = executor.execute_agent(settings, providers, claim)
    orch.now.advance(seconds=settings.lease_s + 1)
    rescue = orch.claim_task(hint.task_id, "worker-b")
    assert rescue is not None and rescue.recovering

    landed: list = []
    with through(orch, BreakNextTransaction(engine)):
        assert orch.complete_tasks([(claim, artifact)], landed) == []
    assert landed == [] and _fencing_rejections(engine) == 1
