"""The agent attempt protocol (SPEC §4.5): at most one paid call, or an honest unknown_execution."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import RetryableError
from app.worker import executor
from app.worker.run import run_task
from tests.conftest import poll_until
from tests.support.agents import BlindAgent, Clock, CountingAgent, CountingPolicy, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def _to_agent_claim(orch, providers, pub, seed=1):
    """Ingest an image, run its visual stage, and claim its agent task as a worker that will 'die'."""
    res = store_and_ingest(orch, "local", png_bytes(seed))
    pub.publish(res.hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    claim = orch.claim_task(hint.task_id, "doomed-worker")
    assert claim is not None and claim.attempt_id and not claim.recovering
    return res, claim


def _attempt_states(engine, task_id):
    return [r[0] for r in rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t ORDER BY attempt_no",
                               t=task_id)]


def test_interrupted_call_is_adopted_from_lookup_with_exactly_one_paid_call(engine, settings):
    clock, policy = Clock(T0), CountingPolicy()
    orch = Orchestrator(engine, settings, clock=clock, policy=policy)
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    res, claim = _to_agent_claim(orch, providers, pub)
    # the attempt is committed in external_started before any call is made
    assert _attempt_states(engine, claim.task_id) == ["external_started"]
    artifact = executor.execute_agent(settings, providers, claim)  # the paid call happens …
    # … and the worker dies before completing. Its lease expires; the sweep re-hints the task.
    clock.advance(seconds=settings.lease_s + 1)
    report = orch.sweep()
    assert claim.task_id in {h.task_id for h in report.hints}
    assert run_task(orch, claim.task_id, "rescuer", providers, pub) == "succeeded"
    assert agent.calls == {"describe": 1, "lookup": 1}
    # the dead worker's late completion is fenced out and changes nothing
    assert orch.complete_task(claim, artifact) == []
    step(orch, providers, pub)
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "succeeded"
    assert agent.calls["describe"] == 1
    assert _attempt_states(engine, claim.task_id) == ["completed"]
    image = orch.get_image("local", res.image["id"])
    assert image["context_status"] == "ready"
    prov = rows(engine, "SELECT context_provenance FROM images WHERE id = :i", i=res.image["id"])[0][0]
    assert prov["attempt_id"] == claim.attempt_id and prov["task_id"] == str(claim.task_id)
    assert prov["reverse_image_policy"] == "forbid" and prov["image_sha256"] == res.image["sha256"]
    # one logical task: one acquire, one commit, one committed grant bound to the task
    grants = rows(engine, "SELECT g.id, g.state, g.task_id, t.grant_id FROM operation_grants g"
                          " JOIN tasks t ON t.id = g.task_id")
    assert len(grants) == 1 and grants[0][1] == "committed" and grants[0][0] == grants[0][3]
    assert list(policy.acquired.values()) == [1] and policy.committed == {grants[0][0]: 1}


def test_unprovable_call_ends_unknown_execution_and_explicit_retry_starts_over(engine, settings):
    clock = Clock(T0)
    orch = Orchestrator(engine, settings, clock=clock)
    agent = BlindAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    res, claim = _to_agent_claim(orch, providers, pub)
    executor.execute_agent(settings, providers, claim)
    clock.advance(seconds=settings.lease_s + 1)
    orch.sweep()
    assert run_task(orch, claim.task_id, "rescuer", providers, pub) == "unknown"
    assert agent.calls == {"describe": 1, "lookup": 1}  # no blind re-call
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "unknown_execution" and job["error"]["code"] == "unknown_execution"
    assert [s["status"] for s in job["stages"]] == ["succeeded", "unknown_execution", "pending"]
    assert _attempt_states(engine, claim.task_id) == ["unknown_execution"]
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=claim.task_id) == [("failed",)]
    assert rows(engine, "SELECT state FROM operation_grants") == [("unknown",)]
    # nothing wakes it: later sweeps and stale hints change nothing and call nothing
    clock.advance(hours=1)
    orch.sweep()
    assert run_task(orch, claim.task_id, "late", providers, pub) == "dropped"
    assert orch.get_job("local", res.job["id"])["status"] == "unknown_execution"
    assert agent.calls["describe"] == 1
    # an explicit retry: new revision, new agent task, new grant
    retried = orch.retry_job("local", res.job["id"])
    assert retried.created and retried.job["revision"] == 2
    assert [s["status"] for s in retried.job["stages"]][:2] == ["reused", "queued"]
    new_task = retried.job["stages"][1]["task_id"]
    assert new_task != str(claim.task_id)
    pub.publish(retried.hints)
    step(orch, providers, pub)
    assert orch.get_job("local", retried.job["id"])["status"] == "succeeded"
    assert agent.calls["describe"] == 2
    grants = rows(engine, "SELECT state, task_id FROM operation_grants ORDER BY created_at, state")
    assert sorted(g[0] for g in grants) == ["committed", "unknown"]
    assert {str(g[1]) for g in grants} == {str(claim.task_id), new_task}


class FlakyAgent(CountingAgent):
    """Fails the first call with a given error, then behaves."""

    def __init__(self, *, results_dir: str, error: Exception):
        super().__init__(results_dir=results_dir)
        self.error = error

    def describe(self, image, *, attempt_id, reverse_image_policy):
        with self._lock:
            self.calls["describe"] += 1
            first = self.calls["describe"] == 1
        if first:
            raise self.error
        return super(CountingAgent, self).describe(image, attempt_id=attempt_id,
                                                   reverse_image_policy=reverse_image_policy)


@pytest.mark.parametrize("not_executed", [True, False])
def test_only_a_provably_unsent_paid_call_is_retried_automatically(engine, settings, not_executed):
    policy = CountingPolicy()
    orch = Orchestrator(engine, settings, policy=policy)  # real clock: backoff must come due
    agent = FlakyAgent(results_dir=str(settings.agent_results_path),
                       error=RetryableError("connection refused", code="agent_unreachable", not_executed=not_executed))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(7))
    pub.publish(res.hints)
    step(orch, providers, pub)
    if not_executed:  # retried after backoff (the sweep re-hints once it is due), same task, same grant
        from tests.conftest import poll_until

        def done():
            pub.publish(orch.sweep().hints)
            step(orch, providers, pub)
            return orch.get_job("local", res.job["id"])["status"] == "succeeded"

        poll_until(done, timeout=20, interval=0.1, what="agent retried and job succeeded")
        assert agent.calls["describe"] == 2
        assert rows(engine, "SELECT count(*), max(attempt_count) FROM tasks WHERE stage = 'agent'") == [(1, 2)]
        assert rows(engine, "SELECT state FROM operation_grants") == [("committed",)]
        assert list(policy.acquired.values()) == [1]
    else:  # the request may have been made: never repeated automatically
        job = orch.get_job("local", res.job["id"])
        assert job["status"] == "unknown_execution" and job["error"]["code"] == "agent_unreachable"
        assert agent.calls["describe"] == 1
        assert rows(engine, "SELECT state FROM operation_grants") == [("unknown",)]


@pytest.mark.parametrize("mode,status", [("badrequest", "failed"), ("servererror", "unknown_execution")])
def test_provider_error_bodies_never_reach_the_tenant(engine, settings, mode, status):
    """A provider's error body (masked key, internal host) and the endpoint's host name stay in the
    log: the task, its attempt, the job and its stage store a stable code and a generic message."""
    from app.stages.providers import Providers
    from tests.support.pipeline import Workers
    from tests.unit.stages.test_openai_compatible import PROVIDER_SECRET, FakeServer

    fake = FakeServer()
    fake.thread.start()
    try:
        settings = settings.replace(agent_provider="openai-compatible", agent_base_url=f"{fake.url}/{mode}/v1",
                                    agent_model="test-vlm", agent_api_key="sk-live-123456", agent_timeout_s=5)
        orch, pub = Orchestrator(engine, settings), RecordingPublisher()
        res = store_and_ingest(orch, "local", png_bytes(3))
        pub.publish(res.hints)
        with Workers(orch, pub, n=1, providers=Providers(settings)):
            job = poll_until(lambda: (j := orch.get_job("local", res.job["id"]))["status"] == status and j,
                             timeout=60, interval=0.05, what=f"job {status}")
    finally:
        fake.httpd.shutdown()
        fake.httpd.server_close()
    stored = rows(engine, """
        SELECT t.error::text || a.error::text || js.error::text || j.error::text
        FROM tasks t JOIN task_attempts a ON a.task_id = t.id
        JOIN job_stages js ON js.task_id = t.id JOIN processing_jobs j ON j.id = t.job_id
        WHERE t.stage = 'agent'""")
    assert len(stored) == 1
    host, port = fake.url.removeprefix("http://").split(":")
    for leak in (PROVIDER_SECRET, "sk-", "internal.corp", host, port):
        assert leak not in stored[0][0], (leak, stored[0][0])
    assert job["error"]["code"].startswith("agent_") or job["error"]["code"] == "unknown_execution", job["error"]
    assert host not in job["error"]["message"]


def test_a_paid_call_whose_image_was_replaced_meanwhile_closes_its_attempt_and_commits_its_grant(engine, settings):
    """The call ran and answered: its attempt is completed and its grant committed (the call is billed),
    though the answer describes bytes the image no longer has and is not written. Left external_started,
    the attempt kept its task and job from retention for ever and the policy never heard of the call."""
    import hashlib

    policy = CountingPolicy()
    orch = Orchestrator(engine, settings, clock=Clock(T0), policy=policy)
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    res, claim = _to_agent_claim(orch, providers, pub, seed=41)
    artifact = executor.execute_agent(settings, providers, claim)  # the paid call answers …
    new = png_bytes(42)  # … while the user replaces the image's content
    sha = hashlib.sha256(new).hexdigest()
    ns = orch.ensure_scope("local")
    (settings.storage_path / f"{ns}/{sha}.png").write_bytes(new)
    orch.replace_content("local", res.image["id"], sha256=sha, media_type="image/png", extension=".png",
                         size_bytes=len(new), width=48, height=40, storage_key=f"{ns}/{sha}.png")
    orch.complete_task(claim, artifact)
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=claim.task_id) == [("cancelled",)]
    assert rows(engine, "SELECT context_status FROM images WHERE id = :i", i=res.image["id"]) == [("pending",)]
    assert _attempt_states(engine, claim.task_id) == ["completed"]
    assert rows(engine, "SELECT state FROM operation_grants WHERE task_id = :t", t=claim.task_id) == [("committed",)]
    assert agent.calls["describe"] == 1 and sum(policy.committed.values()) == 1
