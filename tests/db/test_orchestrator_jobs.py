"""Job create-or-reuse (SPEC §4.2), hints lost or duplicated (§2.1), retries (§4.4)."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import PermanentError, RetryableError
from tests.conftest import poll_until
from tests.support.clock import FakeClock
from tests.support.fakes import Calls, counting_providers
from tests.support.pipeline import Workers, png_bytes, store_and_ingest, visual_task


def _q(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).all()


def test_20_concurrent_requests_for_one_image_make_one_active_job(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(11), process=False)
    assert res.job is None
    barrier = threading.Barrier(20)
    results, errors = [], []

    def request() -> None:
        barrier.wait()
        try:
            results.append(orch.request_processing("local", res.image["id"]))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=request) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.job["id"] for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert _q(engine, "SELECT count(*) FROM processing_jobs") == [(1,)]
    assert _q(engine, "SELECT count(*) FROM tasks") == [(1,)]


def _run_all(orch, pub, providers, n_workers=2):
    with Workers(orch, pub, n=n_workers, providers=providers):
        poll_until(lambda: not _q(orch.engine, "SELECT 1 FROM processing_jobs WHERE status IN ('queued','running')")
                   and pub.pending() == 0, timeout=60, what="no active job")


def test_auto_never_revives_failed_job_and_explicit_reuses_valid_prefix(engine, settings):
    calls = Calls()
    providers = counting_providers(settings, calls)
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(12))
    pub.publish(res.hints)
    # make the agent fail permanently once
    agent = providers.agent
    original = agent.describe
    agent.describe = lambda *a, **k: (_ for _ in ()).throw(PermanentError("nope", code="agent_bad_output"))
    _run_all(orch, pub, providers)
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "agent_bad_output"
    assert [s["status"] for s in job["stages"]] == ["succeeded", "failed", "pending"]
    # auto mode (a re-upload of the same bytes) returns the failed job, no new work
    again = store_and_ingest(orch, "local", png_bytes(12))
    assert not again.created and again.job["id"] == job["id"] and again.hints == []
    assert _q(engine, "SELECT count(*) FROM processing_jobs") == [(1,)]
    # explicit retry: new revision reusing the valid visual stage
    agent.describe = original
    retried = orch.retry_job("local", job["id"])
    assert retried.created and retried.job["revision"] == 2
    assert [s["status"] for s in retried.job["stages"]] == ["reused", "queued", "pending"]
    pub.publish(retried.hints)
    _run_all(orch, pub, providers)
    assert orch.get_job("local", retried.job["id"])["status"] == "succeeded"
    assert calls.by_stage["visual"] == 1  # no visual work redone
    # processing again when everything is valid creates nothing
    same = orch.request_processing("local", res.image["id"])
    assert not same.created and same.job["id"] == retried.job["id"] and same.hints == []


def test_dropping_every_second_hint_sweeps_finish_everything(engine, settings):
    calls = Calls()
    providers = counting_providers(settings, calls)
    orch = Orchestrator(engine, settings.replace(rehint_grace_s=0.05))
    pub = RecordingPublisher()

    class DropEverySecond:
        """Delivers hints 1, 3, 5 … and drops 2, 4, 6 … (how many there are depends on how uploads
        and completions fall into wake-up groups, so only the invariant is asserted below)."""

        def __init__(self) -> None:
            self.seen = self.dropped = 0

        def publish(self, hints):
            for h in hints:
                self.seen += 1
                if self.seen % 2:
                    pub.publish([h])
                else:
                    self.dropped += 1

    lossy = DropEverySecond()
    n = 30
    for i in range(n):
        lossy.publish(store_and_ingest(orch, "local", png_bytes(100 + i)).hints)
    with Workers(orch, pub, n=3, providers=providers, worker_publisher=lossy):
        def done():
            if pub.pending() == 0:
                pub.publish(orch.sweep().hints)
            return _q(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == n
        poll_until(done, timeout=90, interval=0.1, what="all jobs after sweeps")
    # At least one hint was lost whatever the grouping: the first upload's visual hint is delivered,
    # and the first visual completion must wake the agent lane with a second hint (no agent task
    # existed before it) — that one is dropped.
    assert lossy.dropped >= 1
    assert calls.by_stage == {"visual": n, "agent": n, "text": n}


def test_every_hint_duplicated_three_times_runs_each_stage_once(engine, settings):
    calls = Calls()
    providers = counting_providers(settings, calls)
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()

    class Triple:
        def publish(self, hints):
            for h in hints:
                pub.publish([h, h, h])

    n = 30
    for i in range(n):
        Triple().publish(store_and_ingest(orch, "local", png_bytes(200 + i)).hints)
    with Workers(orch, pub, n=4, providers=providers, worker_publisher=Triple()):
        poll_until(lambda: _q(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == n,
                   timeout=90, what="all jobs")
    assert calls.by_stage == {"visual": n, "agent": n, "text": n}
    assert _q(engine, "SELECT max(claim_generation) FROM tasks") == [(1,)]


def test_retryable_twice_then_success_backs_off_and_finishes_on_attempt_3(engine, settings):
    clock = FakeClock()
    calls = Calls()
    providers = counting_providers(settings, calls, visual_failures=[RetryableError("x", code="flaky"),
                                                                     RetryableError("x", code="flaky"), None])
    orch = Orchestrator(engine, settings.replace(backoff_base_s=10, backoff_max_s=100), clock=clock)
    from app.worker.run import run_task

    res = store_and_ingest(orch, "local", png_bytes(21))
    task_id = visual_task(res).task_id
    pub = RecordingPublisher()
    due = []
    for _attempt in (1, 2):
        assert run_task(orch, task_id, "w", providers, pub) == "failed"
        (available_at,) = _q(engine, "SELECT available_at FROM tasks WHERE id = :t", t=task_id)[0]
        due.append(available_at - clock())
        assert run_task(orch, task_id, "w", providers, pub) == "dropped"  # not due yet
        clock.advance(due[-1].total_seconds() + 0.001)
    assert timedelta(seconds=5) <= due[0] <= timedelta(seconds=10)  # base 10 with jitter in [d/2, d]
    assert timedelta(seconds=10) <= due[1] <= timedelta(seconds=20)
    assert run_task(orch, task_id, "w", providers, pub) == "succeeded"
    assert _q(engine, "SELECT status, attempt_count FROM tasks WHERE id = :t", t=task_id) == [("succeeded", 3)]
    assert orch.get_job("local", res.job["id"])["stages"][0]["attempt_count"] == 3


def test_permanent_error_fails_job_with_its_code(engine, settings):
    providers = counting_providers(settings, Calls(), visual_failures=[PermanentError("bad", code="invalid_image")])
    orch = Orchestrator(engine, settings)
    from app.worker.run import run_task

    res = store_and_ingest(orch, "local", png_bytes(22))
    assert run_task(orch, visual_task(res).task_id, "w", providers, RecordingPublisher()) == "failed"
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_image"
    assert job["stages"][0]["status"] == "failed"


def test_exhausted_retries_fail_with_max_attempts_exceeded(engine, settings):
    clock = FakeClock()
    providers = counting_providers(settings, Calls(), visual_failures=[RetryableError("x", code="flaky")] * 3)
    orch = Orchestrator(engine, settings.replace(max_attempts=3), clock=clock)
    from app.worker.run import run_task

    res = store_and_ingest(orch, "local", png_bytes(23))
    for _ in range(3):
        clock.advance(3600)
        assert run_task(orch, visual_task(res).task_id, "w", providers, RecordingPublisher()) == "failed"
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "max_attempts_exceeded"


def test_a_stored_file_that_stays_missing_fails_file_missing_once_attempts_are_spent(engine, settings):
    """A missing file may be a content replace racing the task, so it is retried (read before any
    provider call: nothing ran); one that stays missing ends the job ``file_missing``, not
    ``max_attempts_exceeded`` — the operator's cue to restore it."""
    from app.worker.run import run_task

    clock = FakeClock()
    calls = Calls()
    providers = counting_providers(settings, calls)
    orch = Orchestrator(engine, settings.replace(max_attempts=3), clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(24))
    task = visual_task(res).task_id
    [(key,)] = _q(engine, "SELECT storage_key FROM images WHERE id = :i", i=res.image["id"])
    (settings.storage_path / key).unlink()
    states = []
    for _ in range(3):
        clock.advance(3600)
        run_task(orch, task, "w", providers, RecordingPublisher())
        [(status, error)] = _q(engine, "SELECT status, error FROM tasks WHERE id = :t", t=task)
        states.append((status, error["code"]))
    assert states == [("queued", "file_missing"), ("queued", "file_missing"), ("failed", "file_missing")]
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "file_missing", job["error"]
    assert calls.by_stage["visual"] == 0  # no provider call for a file it could not read
