"""An input that kills the worker process (a decoder or model segfault, an OOM) in a batched lane.

Its whole batch dies with it: every claim's lease lapses with no terminal write. SPEC §10 — one
item's failure never fails, charges or annotates another item of its batch — so a task whose run
died is claimed again *alone* (no wake-up group, no fair fill; no fill ever takes it into another
batch), the attempt of a run that died in a batch of several is refunded, and the sweep ends a
task ``max_attempts_exceeded`` only for deaths in runs of its own. The poisoned item ends failed
after its own solo deaths; its batch-mates, of any scope, succeed on their first charged attempt.

The deaths are simulated in process (``poison.CrashVisual`` raises ``poison.ProcessDied`` through
the worker loop); tests/integration/test_poison_crash_workers.py kills a real Celery worker.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support import poison
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

SMALL = (48, 40)
POISONED = (poison.POISON_WIDTH, 40)
CRASHING = "tests.support.poison:CrashVisual"


@pytest.fixture(autouse=True)
def _fresh_calls():
    poison.reset()
    yield
    poison.reset()


def _ingest(orch, pub, scope, seed, size=SMALL):
    res = store_and_ingest(orch, scope, png_bytes(seed, size))
    pub.publish(res.hints)
    return visual_task(res).task_id


def _tasks(engine) -> dict:
    with engine.connect() as c:
        rows = c.execute(text("SELECT t.id, t.scope_id, t.status, t.attempt_count, t.claimed_alone, t.error,"
                              " i.width FROM tasks t JOIN images i ON i.id = t.image_id"
                              " WHERE t.lane = 'visual'")).mappings().all()
    return {r["id"]: r for r in rows}


def _lapse(clock, s) -> None:
    """Past every lease and the re-hint grace: the dead worker's claims are claimable again."""
    clock.advance(s.lease_s + s.rehint_grace_s + 1)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_worker_killing_image_dies_alone_and_never_charges_another_scopes_batch_mates(
        engine, settings, max_attempts):
    s = settings.replace(max_attempts=max_attempts, visual_provider=CRASHING)
    clock = FakeClock()
    orch, pub, providers = Orchestrator(engine, s, clock=clock), RecordingPublisher(), Providers(s)
    poisoned = _ingest(orch, pub, "tenant-a", 1, POISONED)
    crashes, held, seed = 0, [], 100
    for _ in range(max_attempts + 3):
        for _ in range(4):  # tenant-b keeps uploading meanwhile
            seed += 1
            _ingest(orch, pub, "tenant-b", seed)
        for h in sorted(pub.drain(), key=lambda h: h.task_id != poisoned):  # the poisoned image's hint first
            if h.lane != "visual":
                held.append(h)
                continue
            try:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)
            except poison.ProcessDied:
                crashes += 1
        _lapse(clock, s)
        pub.publish(orch.sweep().hints)
    assert [h for h in pub.drain() if h.lane == "visual"] == []  # nothing left to run

    tasks = _tasks(engine)
    bad, good = tasks.pop(poisoned), list(tasks.values())
    # the first death took a batch with it (the poisoned task and tenant-b's four); every later
    # run of the poisoned image was alone, and only those were charged
    crashed_calls = [sizes for _, sizes, ok in poison.CALLS if not ok]
    assert [len(sizes) for sizes in crashed_calls] == [5] + [1] * max_attempts
    assert crashes == max_attempts + 1
    assert (bad["status"], bad["attempt_count"], bad["error"]["code"]) == ("failed", max_attempts,
                                                                          "max_attempts_exceeded")
    assert len(good) == 4 * (max_attempts + 3) and {g["scope_id"] for g in good} == {"tenant-b"}
    assert {(g["status"], g["attempt_count"]) for g in good} == {("succeeded", 1)}
    assert [g["error"] for g in good] == [None] * len(good)
    with engine.connect() as c:
        failed_jobs = c.execute(text("SELECT scope_id, error->>'code' FROM processing_jobs WHERE status = 'failed'")).all()
        stage_errors = c.execute(text("SELECT count(*) FROM job_stages WHERE error IS NOT NULL")).scalar_one()
    assert failed_jobs == [("tenant-a", "max_attempts_exceeded")]
    assert stage_errors == 1


def test_a_task_whose_batch_died_is_claimed_again_alone_its_attempt_refunded(engine, settings):
    clock = FakeClock()
    orch, pub = Orchestrator(engine, settings, clock=clock), RecordingPublisher()
    a = _ingest(orch, pub, "tenant-a", 1)
    b1, b2 = _ingest(orch, pub, "tenant-b", 2), _ingest(orch, pub, "tenant-b", 3)
    batch = orch.claim_with_batch(a, "visual", 8, "doomed")  # tenant-a's group (a alone), filled with b's
    assert {c.task_id for c in batch.claims} == {a, b1, b2}
    assert {t["claimed_alone"] for t in _tasks(engine).values()} == {False}  # a too, once the fill joined it
    clock.advance(settings.lease_s + 1)  # the worker died: every lease lapsed
    c1, c2 = _ingest(orch, pub, "tenant-c", 4), _ingest(orch, pub, "tenant-c", 5)  # due, queued

    again = orch.claim_with_batch(b1, "visual", 8, "w2")
    assert [c.task_id for c in again.claims] == [b1] and again.hints == []  # no group, no fill
    assert again.claims[0].attempt_count == 1  # the death in a batch of three is charged to none of them
    assert {c.task_id for c in orch.claim_batch("visual", 8, "w3")} == {c1, c2}  # a fill takes no dead task
    tasks = _tasks(engine)
    assert tasks[b1]["claimed_alone"] and not tasks[c1]["claimed_alone"]
    assert [t["attempt_count"] for t in tasks.values()] == [1] * 5


def test_a_dead_hinted_task_leaves_its_queued_group_to_a_new_hint(engine, settings):
    small = SMALL[0] * SMALL[1]
    s = settings.replace(visual_batch_max_pixels=2 * small)
    clock = FakeClock()
    orch, pub = Orchestrator(engine, s, clock=clock), RecordingPublisher()
    named = _ingest(orch, pub, "local", 1)
    for seed in (2, 3):
        _ingest(orch, pub, "local", seed)  # they join the wake-up group ``named`` names
    first = orch.claim_with_batch(named, "visual", 8, "doomed")
    assert len(first.claims) == 2 and [h.task_id for h in first.hints] == [named]  # one member left out
    clock.advance(s.lease_s + 1)  # the worker died before the new hint was handled
    alone = orch.claim_with_batch(named, "visual", 8, "w2")
    assert [c.task_id for c in alone.claims] == [named] and [h.task_id for h in alone.hints] == [named]
    rest = orch.claim_with_batch(named, "visual", 8, "w3")  # the group's queued member, not the other dead one
    assert len(rest.claims) == 1 and rest.claims[0].task_id not in {c.task_id for c in first.claims}


def test_the_sweep_ends_a_task_only_for_deaths_in_runs_of_its_own(engine, settings):
    s = settings.replace(max_attempts=1)
    clock = FakeClock()
    orch, pub, providers = Orchestrator(engine, s, clock=clock), RecordingPublisher(), Providers(s)
    a, b = _ingest(orch, pub, "tenant-a", 1), _ingest(orch, pub, "tenant-b", 2)
    assert len(orch.claim_with_batch(a, "visual", 8, "doomed").claims) == 2
    _lapse(clock, s)
    report = orch.sweep()  # both at max_attempts, but neither died alone: both re-hinted
    assert report.counts["exhausted"] == 0 and {h.task_id for h in report.hints} == {a, b}
    assert handle_hint(orch, "visual", b, "w", providers, pub) == 1  # alone, and it succeeds
    assert [c.attempt_count for c in orch.claim_with_batch(a, "visual", 8, "doomed-again").claims] == [1]
    _lapse(clock, s)  # a died again, alone this time: charged, and its attempts are spent
    report = orch.sweep()
    assert report.counts["exhausted"] == 1 and report.counts["lease_expired"] == 0
    tasks = _tasks(engine)
    assert (tasks[a]["status"], tasks[a]["error"]["code"]) == ("failed", "max_attempts_exceeded")
    assert (tasks[b]["status"], tasks[b]["attempt_count"], tasks[b]["error"]) == ("succeeded", 1, None)


def test_a_first_run_that_died_alone_is_charged_at_once(engine, settings):
    s = settings.replace(max_attempts=1)
    clock = FakeClock()
    orch, pub = Orchestrator(engine, s, clock=clock), RecordingPublisher()
    a = _ingest(orch, pub, "local", 1)
    assert len(orch.claim_with_batch(a, "visual", 8, "doomed").claims) == 1  # nothing else due: alone
    _lapse(clock, s)
    assert orch.sweep().counts["exhausted"] == 1  # no extra run: the death was its own
    assert _tasks(engine)[a]["status"] == "failed"


class _ProcessOrch:
    """The orchestrator as one simulated worker process sees it: once the process died, none of
    its threads claims or writes anything more (a real dead process does nothing)."""

    _DEAD_CALLS = {"claim_with_batch", "run_alone", "complete_tasks", "fail_task"}

    def __init__(self, orch, process) -> None:
        self._orch, self._process = orch, process

    def __getattr__(self, name):
        if name in self._DEAD_CALLS and self._process.dead:
            raise poison.ProcessDied()
        return getattr(self._orch, name)


def test_a_threads_worker_charges_a_death_only_to_a_run_that_was_alone_in_its_process(engine, settings,
                                                                                        monkeypatch):
    """A worker of several threads (a threads pool) runs claims side by side: a task claimed alone
    is not alone in its process. When the poisoned image kills the process, the other thread's task
    dies with it and must not be charged — else the innocent task fails max_attempts_exceeded after
    running beside the poisoned one max_attempts times (each re-hinted run of both is a claim "alone")."""
    from app.worker import run

    max_attempts = 2
    s = settings.replace(max_attempts=max_attempts, visual_provider="tests.support.poison:ThreadedCrashVisual")
    clock = FakeClock()
    orch, pub, providers = Orchestrator(engine, s, clock=clock), RecordingPublisher(), Providers(s)
    monkeypatch.setattr(run, "COMPUTE_THREADS", 2, raising=False)  # what a threads pool of two sets
    poisoned = _ingest(orch, pub, "tenant-a", 1, POISONED)
    innocent = _ingest(orch, pub, "tenant-b", 2)
    errors: list[BaseException] = []

    def thread(worker, hint) -> None:
        try:
            handle_hint(worker, hint.lane, hint.task_id, "w", providers, pub)
        except poison.ProcessDied:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    import threading

    for _ in range(max_attempts + 3):
        worker = _ProcessOrch(orch, poison.new_process())  # the supervisor restarted it
        hints = [h for h in pub.drain() if h.lane == "visual"]
        threads = [threading.Thread(target=thread, args=(worker, h)) for h in hints]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads) and errors == []
        _lapse(clock, s)
        pub.publish(orch.sweep().hints)
    tasks = _tasks(engine)
    assert (tasks[poisoned]["status"], tasks[poisoned]["error"]["code"]) == ("failed", "max_attempts_exceeded")
    assert (tasks[innocent]["status"], tasks[innocent]["attempt_count"], tasks[innocent]["error"]) == (
        "succeeded", 1, None)
