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


# The tests that need a busy lane (a batch ended less than the linger ago) use a linger of seconds:
# the fake sleep makes it cost nothing, and the lane is still busy however long the setup between
# the batch's end and the next claim takes on a loaded box (with 500 ms, a slow ingest made the
# lane idle and the claim took one task instead of the batch).
BUSY_LINGER_MS = 10_000.0


def test_a_busy_lane_waits_and_claims_what_became_due_meanwhile_in_one_batch(engine, settings, monkeypatch):
    settings = dataclasses.replace(settings, visual_batch_linger_ms=BUSY_LINGER_MS)
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
    assert len(waited) == 1 and 0 < waited[0] <= BUSY_LINGER_MS / 1000


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


def _to_embedding(orch, providers, pub, seeds) -> list:
    """Run the images' visual and agent tasks (no linger); return the embedding lane's hints."""
    pending = [_ingest(orch, s) for s in seeds]
    text = []
    while pending:
        hint = pending.pop(0)
        if hint.lane == "embedding":
            text.append(hint)
            continue
        run.handle_hint(orch, hint.lane, hint.task_id, "w0", providers, pub)
        pending.extend(pub.drain())
    return text


def test_a_lane_fed_by_earlier_lanes_stops_waiting_once_they_have_nothing_left(engine, settings, monkeypatch):
    # the end of a burst: no visual or agent task is queued or running, so no more documents can
    # come from them — the embedding worker claims what is due at once instead of waiting out its linger
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=500.0)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [50, 51])
    assert text and not orch.earlier_lanes_active("embedding")
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"embedding": time.monotonic()})  # a batch just ended
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 2
    assert slept == []


def test_a_lane_fed_by_earlier_lanes_waits_while_they_have_work_and_takes_what_they_hand_on(
    engine, settings, monkeypatch,
):
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=BUSY_LINGER_MS)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [52])
    later = _ingest(orch, 53)  # its visual task is queued: an earlier lane has work
    assert orch.earlier_lanes_active("embedding")
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # meanwhile the earlier lanes finish the other image
        slept.append(seconds)
        if len(slept) == 1:
            pending = [later]
            while pending:
                hint = pending.pop(0)
                if hint.lane != "embedding":
                    run.handle_hint(orch, hint.lane, hint.task_id, "w0", providers, pub)
                    pending.extend(pub.drain())

    monkeypatch.setattr(run.time, "sleep", sleep)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"embedding": time.monotonic()})
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 2
    # one slice of the wait, then the earlier lanes were idle: no second slice
    assert slept == [run.LINGER_RECHECK_S]


def test_the_first_lane_waits_its_whole_linger_in_one_sleep(engine, settings, monkeypatch):
    # the visual lane is fed by uploads, which no lane's state announces: it waits as configured
    orch = Orchestrator(engine, dataclasses.replace(settings, visual_batch_linger_ms=BUSY_LINGER_MS))
    providers, pub = Providers(settings), RecordingPublisher()
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    hint = _ingest(orch, 54)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"visual": time.monotonic()})
    assert run.handle_hint(orch, "visual", hint.task_id, "w1", providers, pub, lingers=True) == 1
    assert len(slept) == 1 and 0 < slept[0] <= BUSY_LINGER_MS / 1000


def _burst_spy(providers, monkeypatch) -> list[int]:
    """The burst cores each text-embedding call of ``providers`` ran with."""
    from app.stages import cpu

    seen: list[int] = []
    text = providers.text
    embed = text.embed
    monkeypatch.setattr(text, "embed", lambda docs: (seen.append(cpu.burst_cores()), embed(docs))[1])
    return seen


def test_the_end_of_a_burst_gives_the_embedding_batch_every_core(engine, settings, monkeypatch):
    # no visual or agent task queued or running: their cores are idle, so the last batch may use them
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=500.0, local_burst_cores=2)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [55, 56])
    seen = _burst_spy(providers, monkeypatch)
    monkeypatch.setattr(run.time, "sleep", lambda s: None)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"embedding": time.monotonic()})  # the linger asks
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 2
    assert seen == [2]
    # a worker that does not linger asks once itself
    more = _to_embedding(orch, providers, pub, [57])
    assert run.handle_hint(orch, "embedding", more[0].task_id, "w1", providers, pub) == 1
    assert seen == [2, 2]


def test_while_earlier_lanes_have_work_the_embedding_batch_keeps_one_core(engine, settings, monkeypatch):
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=0.0, local_burst_cores=2)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [58])
    later = _ingest(orch, 59)  # its visual task is queued: the agent lane's cores will be busy
    assert later.lane == "visual" and orch.earlier_lanes_active("embedding")
    seen = _burst_spy(providers, monkeypatch)
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 1
    assert seen == [1]
    # the first lane never bursts (uploads feed it; nothing announces them)
    assert run.handle_hint(orch, "visual", later.task_id, "w1", providers, pub, lingers=True) == 1


def test_a_lane_fed_by_earlier_lanes_stops_waiting_once_only_their_last_tasks_run(engine, settings, monkeypatch):
    # nothing queued upstream, one agent task still running (the burst's last OCR): the documents
    # due now are claimed at once, on the core that task leaves idle; the last one comes after
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=500.0, local_burst_cores=2)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [60])
    agent = _ingest(orch, 61)
    run.handle_hint(orch, agent.lane, agent.task_id, "w0", providers, pub)  # its visual task
    (agent,) = [h for h in pub.drain() if h.lane == "agent"]
    assert orch.claim_agent_batch(agent.task_id, 1, "w0")  # running, not completed
    assert orch.earlier_lanes_pending("embedding") == (False, True)
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"embedding": time.monotonic()})  # a batch just ended
    seen = _burst_spy(providers, monkeypatch)
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 1
    assert slept == [] and seen == [1]  # no wait, and one core: the agent's task still has the other


def test_with_bursts_off_the_linger_waits_while_the_last_agent_task_runs(engine, settings, monkeypatch):
    # the default (MEMEFLOW_LOCAL_BURST_CORES=1): §31's linger, waiting while a task runs upstream
    # 3 s: at most 30 slices (one question to the database each), and at least two however long
    # the setup after the batch's end took
    settings = dataclasses.replace(settings, embedding_batch_linger_ms=3000.0, local_burst_cores=1)
    orch = Orchestrator(engine, settings)
    providers, pub = Providers(settings), RecordingPublisher()
    text = _to_embedding(orch, providers, pub, [62])
    agent = _ingest(orch, 63)
    run.handle_hint(orch, agent.lane, agent.task_id, "w0", providers, pub)
    (agent,) = [h for h in pub.drain() if h.lane == "agent"]
    assert orch.claim_agent_batch(agent.task_id, 1, "w0")
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    monkeypatch.setattr(run, "_BATCH_ENDED", {"embedding": time.monotonic()})
    seen = _burst_spy(providers, monkeypatch)
    assert run.handle_hint(orch, "embedding", text[0].task_id, "w1", providers, pub, lingers=True) == 1
    # the rest of its linger in 100 ms slices (however long the setup took), one core
    assert len(slept) >= 2 and sum(slept) <= 3.0 + 1e-9 and seen == [1]
