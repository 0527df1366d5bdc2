"""Recall-safe agents (local compute: ``local-ocr``, ``deterministic``): an attempt whose worker died
runs again instead of ending ``unknown_execution`` — the interrupted attempt recorded ``failed``
(``worker_died``), a fresh one under the same task and grant — while a poison input that kills
the worker every time spends its own attempts and ends ``max_attempts_exceeded``, and a death in
a batch charges none of its batch-mates. Whether an attempt may run again is read from its row
(``task_attempts.recall_safe``, recorded by the claim that started it), never from the setting
or a message. The deaths are simulated in process (``poison.ProcessDied`` raised through the
worker code, as a segfault would end it); real worker processes: tests/integration/test_recall_safe_workers.py."""

from __future__ import annotations

from datetime import datetime, timezone

from app.orchestrator import Orchestrator, RecordingPublisher
from app.worker.run import handle_hint
from tests.support import poison
from tests.support.agents import Clock, CountingAgent, CountingPolicy, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


class LocalAgent(CountingAgent):
    """A counting local agent that declares itself recall-safe; it dies (``ProcessDied``) on a
    poisoned image (``poison.POISON_WIDTH`` pixels wide), as a model segfault would."""

    recall_safe = True

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        if poison.is_poisoned(image):
            with self._lock:
                self.calls["died"] += 1
            raise poison.ProcessDied()
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


def _setup(engine, settings, **overrides):
    s = settings.replace(**overrides)
    clock, policy = Clock(T0), CountingPolicy()
    orch = Orchestrator(engine, s, clock=clock, policy=policy)
    agent = LocalAgent(results_dir=str(s.agent_results_path))
    return s, clock, policy, orch, agent, providers_with(s, agent), RecordingPublisher()


def _to_agent_hint(orch, providers, pub, *images):
    """Ingest ``images`` (png bytes), run their visual stage; the first agent hint."""
    for data in images:
        pub.publish(store_and_ingest(orch, "local", data).hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    return hint


def _lapse(clock, orch, pub, s):
    """The dead worker's lease expires; the sweep (beat) re-hints or ends its task."""
    clock.advance(seconds=s.lease_s + s.rehint_grace_s + 1)
    pub.publish(orch.sweep().hints)


def _attempts(engine, task_id):
    return [(r[0], r[1], r[2]) for r in rows(
        engine, "SELECT state, error->>'code', recall_safe FROM task_attempts WHERE task_id = :t ORDER BY attempt_no",
        t=task_id)]


def _task(engine, task_id):
    return rows(engine, "SELECT status, attempt_count, error->>'code' FROM tasks WHERE id = :t", t=task_id)[0]


def test_a_local_agent_call_whose_worker_died_runs_again_and_the_job_succeeds(engine, settings):
    s, clock, policy, orch, agent, providers, pub = _setup(engine, settings)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(1))
    # a worker claims the agent task (its attempt committed, recall-safe as its agent is) and dies
    # before the call returns anything: no result, no record
    doomed = orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True)
    assert doomed is not None and doomed.attempt_id and doomed.recall_safe
    assert _attempts(engine, hint.task_id) == [("external_started", None, True)]
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)  # no human: the recovery runs it again, then the text stage
    job = rows(engine, "SELECT status, error FROM processing_jobs")[0]
    assert job == ("succeeded", None)
    # the interrupted attempt says what happened; the fresh one completed; one call, one lookup
    assert _attempts(engine, hint.task_id) == [("failed", "worker_died", True), ("completed", None, True)]
    assert agent.calls == {"lookup": 1, "describe": 1}
    assert _task(engine, hint.task_id) == ("succeeded", 2, None)
    # the retry reused the task's grant: acquired once, committed once
    grants = rows(engine, "SELECT g.state FROM operation_grants g JOIN tasks t ON t.grant_id = g.id WHERE t.id = :t",
                  t=hint.task_id)
    assert grants == [("committed",)] and list(policy.acquired.values()) == [1]
    assert sum(policy.committed.values()) == 1
    prov = rows(engine, "SELECT context_provenance->>'attempt_id' FROM images")[0][0]
    completed = rows(engine, "SELECT attempt_id FROM task_attempts WHERE state = 'completed'")[0][0]
    assert prov == completed != doomed.attempt_id


def test_a_result_recorded_before_the_death_is_adopted_not_computed_again(engine, settings):
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(2))
    doomed = orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True)
    from app.worker import executor

    executor.execute_agent(s, providers, doomed)  # the call finished and recorded; the commit was lost
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    assert rows(engine, "SELECT status FROM processing_jobs") == [("succeeded",)]
    assert agent.calls == {"describe": 1, "lookup": 1}
    assert _attempts(engine, hint.task_id) == [("completed", None, True)]


def test_the_attempt_row_decides_not_the_worker_now_serving(engine, settings):
    """An attempt started by a worker whose agent was not recall-safe (a paid one) ends
    ``unknown_execution`` even when the worker recovering it runs a recall-safe agent."""
    s, clock, policy, orch, agent, providers, pub = _setup(engine, settings)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(3))
    assert orch.claim_task(hint.task_id, "paid-worker", recall_safe=False) is not None
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    assert rows(engine, "SELECT status, error->>'code' FROM processing_jobs") == [("unknown_execution", "unknown_execution")]
    assert _attempts(engine, hint.task_id) == [("unknown_execution", "unknown_execution", False)]
    assert agent.calls == {"lookup": 1}  # no blind re-call
    assert rows(engine, "SELECT state FROM operation_grants") == [("unknown",)]


def test_a_poison_image_that_kills_the_worker_every_time_ends_failed_after_max_attempts(engine, settings):
    max_attempts = 3
    # batches of one: each claim is a run alone, so every death is the poison's own
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings, max_attempts=max_attempts, agent_batch_size=1)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(4, (poison.POISON_WIDTH, 40)))
    pub.publish([hint])
    deaths = 0
    for _ in range(max_attempts + 3):  # more rounds than attempts: no crash loop
        for h in pub.drain():
            try:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)
            except poison.ProcessDied:
                deaths += 1
        _lapse(clock, orch, pub, s)
    assert deaths == max_attempts == agent.calls["died"]
    # + 1: the recovery claim after the last death looked its attempt up (nothing recorded), no call
    assert _task(engine, hint.task_id) == ("failed", max_attempts + 1, "max_attempts_exceeded")
    assert rows(engine, "SELECT status, error->>'code' FROM processing_jobs") == [("failed", "max_attempts_exceeded")]
    stages = rows(engine, "SELECT stage, status FROM job_stages ORDER BY position")
    assert stages == [("visual", "succeeded"), ("agent", "failed"), ("text_embedding", "pending")]
    # every attempt is closed and says what happened; none is left unknown or open
    assert _attempts(engine, hint.task_id) == (
        [("failed", "worker_died", True)] * (max_attempts - 1) + [("failed", "max_attempts_exceeded", True)])
    assert [h for h in pub.drain() if h.lane == "agent"] == []


def test_a_death_in_an_agent_batch_charges_none_of_its_batch_mates(engine, settings):
    """A batch of two calls in one process: the poison kills it, taking its batch-mate's run along.
    Neither death is charged (a run beside another is ``shared``); each is recovered alone — the
    batch-mate adopted or run again, once, uncharged; the poison run again alone until its own
    deaths spend its attempts."""
    max_attempts = 2
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings, max_attempts=max_attempts, agent_batch_size=2,
                                                      agent_lane_limit=0)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(5, (poison.POISON_WIDTH, 40)), png_bytes(6))
    agent_tasks = dict(rows(engine, "SELECT t.id, i.width FROM tasks t JOIN images i ON i.id = t.image_id"
                                    " WHERE t.lane = 'agent'"))
    # one wake-up group: its hint claims both into one batch
    assert rows(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND (id = :h OR hint_group = :h)",
                h=hint.task_id) == [(2,)]
    pub.publish([hint])
    deaths = 0
    for _ in range(max_attempts + 4):
        for h in pub.drain():
            try:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)
            except poison.ProcessDied:
                deaths += 1
        _lapse(clock, orch, pub, s)
    bad = next(t for t, w in agent_tasks.items() if w == poison.POISON_WIDTH)
    good = next(t for t, w in agent_tasks.items() if w != poison.POISON_WIDTH)
    # the batch's death (charged to neither) and then max_attempts deaths of its own, alone
    assert deaths == max_attempts + 1 == agent.calls["died"]
    assert _task(engine, bad) == ("failed", max_attempts + 1, "max_attempts_exceeded")  # + 1: the lookup claim
    assert _task(engine, good) == ("succeeded", 1, None)
    # its call may have recorded its result before the death (adopted) or not (run again)
    good_attempts = _attempts(engine, good)
    assert good_attempts[-1] == ("completed", None, True)
    assert good_attempts[:-1] in ([], [("failed", "worker_died", True)])
    assert rows(engine, "SELECT status FROM processing_jobs ORDER BY status") == [("failed",), ("succeeded",)]


def test_recovery_through_run_task_runs_the_call_again(engine, settings):
    """The single-claim path (``run_task`` → ``execute_claim``) recovers the same way."""
    from app.worker.run import run_task

    s, clock, _, orch, agent, providers, pub = _setup(engine, settings)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(7))
    assert orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True) is not None
    clock.advance(seconds=s.lease_s + s.rehint_grace_s + 1)
    orch.sweep()
    assert run_task(orch, hint.task_id, "rescuer", providers, pub) == "succeeded"
    assert agent.calls == {"lookup": 1, "describe": 1}
    assert _attempts(engine, hint.task_id) == [("failed", "worker_died", True), ("completed", None, True)]


class FlakyLocalAgent(LocalAgent):
    """A recall-safe agent whose first call fails with an unexpected error (a library bug, an
    out-of-memory raised as an exception): not "provably not executed", yet harmless to repeat."""

    recall_safe = True  # declared by each class itself, never inherited

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        with self._lock:
            self.calls["attempted"] += 1
            first = self.calls["attempted"] == 1
        if first:
            raise MemoryError("the OCR model ran out of memory")
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


def test_a_recall_safe_agents_transient_error_is_retried_not_unknown(engine, settings):
    s = settings.replace()
    clock = Clock(T0)
    orch = Orchestrator(engine, s, clock=clock)
    agent = FlakyLocalAgent(results_dir=str(s.agent_results_path))
    providers, pub = providers_with(s, agent), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, png_bytes(8))
    pub.publish([hint])
    for _ in range(4):  # the retry's backoff passes; the sweep re-hints it
        step(orch, providers, pub)
        _lapse(clock, orch, pub, s)
    assert rows(engine, "SELECT status FROM processing_jobs") == [("succeeded",)]
    assert _attempts(engine, hint.task_id) == [("failed", "internal_error", True), ("completed", None, True)]


def test_the_task_read_shows_each_attempt_with_its_id_and_recall_safety(engine, settings):
    """``GET /api/v1/tasks/{id}`` (docs/operations.md: an operator finds an attempt's idempotency key
    there) lists every attempt with its ``attempt_id`` and whether it could be run again."""
    s, clock, _, orch, _, providers, pub = _setup(engine, settings)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(9))
    doomed = orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True)
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    attempts = orch.get_task("local", hint.task_id)["attempts"]
    assert [(a["attempt_no"], a["state"], (a["error"] or {}).get("code"), a["recall_safe"]) for a in attempts] == [
        (1, "failed", "worker_died", True), (2, "completed", None, True)]
    assert attempts[0]["attempt_id"] == doomed.attempt_id and attempts[1]["attempt_id"] != doomed.attempt_id


def test_a_result_recorded_before_the_last_attempts_death_is_adopted(engine, settings):
    """The run that died held the task's last attempt (alone): the sweep does not end it
    ``max_attempts_exceeded`` unseen — one recovery claim looks its attempt up first, and the result
    the agent recorded before the death is adopted (no second call)."""
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings, max_attempts=1, agent_batch_size=1)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(10))
    doomed = orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True)
    from app.worker import executor

    executor.execute_agent(s, providers, doomed)  # the last attempt's call recorded; the commit was lost
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    assert rows(engine, "SELECT status, error FROM processing_jobs") == [("succeeded", None)]
    assert agent.calls == {"describe": 1, "lookup": 1}
    assert _attempts(engine, hint.task_id) == [("completed", None, True)]


def test_a_paid_result_recorded_before_the_last_attempts_death_is_adopted(engine, settings):
    """The same for a paid attempt (SPEC §4.5: a claim that finds an attempt still external_started
    first asks the provider): the sweep does not end it ``unknown_execution`` without a lookup."""
    s, clock, policy, orch, agent, providers, pub = _setup(engine, settings, max_attempts=1, agent_batch_size=1)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(11))
    doomed = orch.claim_task(hint.task_id, "paid-worker", recall_safe=False)
    from app.worker import executor

    executor.execute_agent(s, providers, doomed)  # the provider answered (and billed); the commit was lost
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    assert rows(engine, "SELECT status, error FROM processing_jobs") == [("succeeded", None)]
    assert agent.calls == {"describe": 1, "lookup": 1}
    assert _attempts(engine, hint.task_id) == [("completed", None, False)]
    assert sum(policy.committed.values()) == 1


def test_a_last_attempt_whose_lookup_finds_nothing_ends_without_another_call(engine, settings):
    """The recovery claim past the last attempt only looks up: nothing recorded → a recall-safe
    attempt ends ``max_attempts_exceeded`` (not run again), a paid one ``unknown_execution``; and
    that claim dying too leaves the sweep to end the task — no loop."""
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings, max_attempts=1, agent_batch_size=1)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(12))
    assert orch.claim_task(hint.task_id, "doomed-worker", recall_safe=True) is not None
    _lapse(clock, orch, pub, s)
    step(orch, providers, pub)
    assert agent.calls == {"lookup": 1}
    assert _task(engine, hint.task_id) == ("failed", 2, "max_attempts_exceeded")
    assert _attempts(engine, hint.task_id) == [("failed", "max_attempts_exceeded", True)]
    assert rows(engine, "SELECT status, error->>'code' FROM processing_jobs") == [("failed", "max_attempts_exceeded")]


def test_a_recovery_claim_past_the_last_attempt_that_dies_too_is_ended_by_the_sweep(engine, settings):
    s, clock, _, orch, agent, providers, pub = _setup(engine, settings, max_attempts=1, agent_batch_size=1)
    hint = _to_agent_hint(orch, providers, pub, png_bytes(13))
    assert orch.claim_task(hint.task_id, "doomed-worker", recall_safe=False) is not None
    _lapse(clock, orch, pub, s)
    # the recovery claim's worker dies before its lookup: the task is not claimable again
    again = orch.claim_task(hint.task_id, "doomed-too", recall_safe=False)
    assert again is not None and again.recovering
    _lapse(clock, orch, pub, s)
    assert orch.claim_task(hint.task_id, "third", recall_safe=False) is None
    step(orch, providers, pub)
    assert rows(engine, "SELECT status, error->>'code' FROM processing_jobs") == [("unknown_execution",
                                                                                    "unknown_execution")]
    assert _attempts(engine, hint.task_id) == [("unknown_execution", "unknown_execution", False)]
    assert agent.calls == {}
