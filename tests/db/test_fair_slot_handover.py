"""A freed agent-lane slot is handed to the fairest waiting task on every path that frees it
(SPEC §4.10, docs/architecture.md "Fairness") — on a real PostgreSQL."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import RetryableError
from app.stages.providers import Providers
from tests.conftest import poll_until
from tests.support.agents import rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


def test_a_retryable_failure_hands_its_freed_slot_to_the_waiting_scope(engine, settings):
    """Lane limit 1: tenant A's agent task runs, tenant B's claim is refused (B now waits unhinted).
    A's task fails with a retryable error (a flaky provider): its slot frees, and B's task must be
    hinted by that transaction — not left idle until the next sweep, as after a success or a
    permanent failure."""
    settings = dataclasses.replace(settings, agent_lane_limit=1, backoff_base_s=60, backoff_max_s=60)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8100)).hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8101)).hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    assert hint_a is not None and hint_b is not None
    [claim_a] = orch.claim_agent_batch(hint_a.task_id, 1, "w1")
    assert orch.claim_agent_batch(hint_b.task_id, 1, "w2") == []  # the one slot is A's: refused
    assert rows(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=hint_b.task_id) == [(None,)]

    hints = orch.fail_task(claim_a, RetryableError("provider busy"))

    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    # now: B's; when its backoff ends: A's own (a delayed hint, tests/db/test_delayed_retry_hints.py)
    assert [(h.task_id, h.eta is None) for h in hints if h.lane == "agent"] == [(hint_b.task_id, True),
                                                                                (hint_a.task_id, False)]
    assert rows(engine, "SELECT last_hint_at IS NOT NULL FROM tasks WHERE id = :t", t=hint_b.task_id) == [(True,)]
    assert len(orch.claim_agent_batch(hint_b.task_id, 1, "w2")) == 1


def test_a_batch_completion_refills_every_slot_it_freed_when_one_scope_waits(engine, settings):
    """Lane limit 2, agent batch 2 (the remote agent's default shape). One tenant's four agent
    tasks, each its own wake-up group: two run, the other two are refused for want of a slot and
    wait unhinted. The two running complete together, freeing two slots: both waiting tasks must
    be hinted. The fairest-task read gave one task per waiting scope, so with a single scope
    waiting one freed slot stayed idle until the sweep."""
    from app.orchestrator import AgentArtifact

    settings = dataclasses.replace(settings, agent_lane_limit=2, agent_batch_size=2)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    hints = []
    for i in range(4):  # one upload at a time: each agent task is a group of its own
        pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8200 + i)).hints)
        hints.append(step(orch, providers, pub, stop_lane="agent"))
    claims = [c for h in hints[:2] for c in orch.claim_agent_batch(h.task_id, 2, f"w{h.task_id}")]
    assert len(claims) == 2
    for h in hints[2:]:
        assert orch.claim_agent_batch(h.task_id, 2, "w3") == []  # both slots held: refused
    waiting = {h.task_id for h in hints[2:]}
    assert rows(engine, "SELECT count(*) FROM tasks WHERE id = ANY(:t) AND last_hint_at IS NULL",
                t=list(waiting)) == [(2,)]

    freed = orch.complete_tasks([(c, AgentArtifact({"title": "t", "tags": []}, "m", c.attempt_id)) for c in claims])

    assert {h.task_id for h in freed if h.lane == "agent"} == waiting
    claimed = [c for h in freed if h.lane == "agent" for c in orch.claim_agent_batch(h.task_id, 2, "w4")]
    assert {c.task_id for c in claimed} == waiting


def test_deleting_an_image_whose_agent_task_runs_hands_its_slot_to_the_waiting_scope(engine, settings):
    """The delete's cascade freed the running task's slot (its holder set to NULL) but hinted no one:
    the refused task of another tenant waited for the sweep."""
    import uuid

    settings = dataclasses.replace(settings, agent_lane_limit=1)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    a = store_and_ingest(orch, "tenant-a", png_bytes(8300))
    pub.publish(a.hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8301)).hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    assert len(orch.claim_agent_batch(hint_a.task_id, 1, "w1")) == 1
    assert orch.claim_agent_batch(hint_b.task_id, 1, "w2") == []  # the one slot is A's: refused

    hints = orch.delete_image("tenant-a", uuid.UUID(a.image["id"]))

    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    assert [h.task_id for h in hints if h.lane == "agent"] == [hint_b.task_id]
    assert len(orch.claim_agent_batch(hint_b.task_id, 1, "w2")) == 1


def test_hints_reordered_by_concurrent_workers_leave_no_free_slot_unhinted(engine, settings):
    """Lane limit 2. Tenant A runs two agent tasks; A's third and B's first are refused (no slot)
    and wait unhinted. A's two complete together: two slots free, and the completion hints both
    waiters (B's first, then A's third). Two workers take those hints in the other order: A's claim
    comes first and is refused — B, served less recently, waits (its hint is on its way) — so A's
    hint is spent; B's claim then takes one slot. One slot is free and A's task is due: B's admitted
    claim must hint it (returned to publish after its commit) instead of leaving it to the sweep
    (MEMEFLOW_SWEEP_INTERVAL_S + MEMEFLOW_REHINT_GRACE_S)."""
    from app.orchestrator import AgentArtifact

    settings = dataclasses.replace(settings, agent_lane_limit=2, agent_batch_size=1)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    hints_a = []
    for i in range(3):
        pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8400 + i)).hints)
        hints_a.append(step(orch, providers, pub, stop_lane="agent"))
    running = [c for h in hints_a[:2] for c in orch.claim_agent_batch(h.task_id, 1, f"w{h.task_id}")]
    assert len(running) == 2
    assert orch.claim_agent_batch(hints_a[2].task_id, 1, "w3") == []  # no free slot: refused
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8410)).hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    assert orch.claim_agent_batch(hint_b.task_id, 1, "w4") == []

    freed = orch.complete_tasks([(c, AgentArtifact({"title": "t", "tags": []}, "m", c.attempt_id))
                                 for c in running])
    assert [h.task_id for h in freed if h.lane == "agent"] == [hint_b.task_id, hints_a[2].task_id]
    refusal_hints: list = []
    assert orch.claim_agent_batch(hints_a[2].task_id, 1, "w5", hints_out=refusal_hints) == []  # B waits
    assert refusal_hints == []  # B, the fairer, still holds its live hint: A's task is not re-hinted yet
    claim_hints: list = []
    assert len(orch.claim_agent_batch(hint_b.task_id, 1, "w6", hints_out=claim_hints)) == 1

    free = rows(engine, "SELECT count(*) FROM lane_slots WHERE lane = 'agent' AND resource_key = '*'"
                        " AND slot_no < 2 AND task_id IS NULL")[0][0]
    unhinted = rows(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'queued'"
                            " AND last_hint_at IS NULL")[0][0]
    assert free == 1
    assert unhinted == 0, "a slot is free and a due agent task waits with no hint: only the sweep wakes it"
    assert [h.task_id for h in claim_hints] == [hints_a[2].task_id]
    assert len(orch.claim_agent_batch(hints_a[2].task_id, 1, "w7")) == 1


def test_a_fairness_refusal_hints_the_due_retry_that_outranks_it(engine, settings):
    """Lane limit 1. Tenant A's agent task fails with a retryable error: it is requeued after a
    backoff with no hint (``last_hint_at`` cleared: a backoff past ``delayed_hint_max_s``, here
    delayed hints off) and its slot frees. Tenant B is served since (more recently than A). Once
    A's retry is due, B's next claim is refused — A, served less recently, waits — so B's hint is
    spent too. The refusal must hint A's task (the slot is free), not leave both unhinted for the
    sweep."""
    from datetime import UTC, datetime

    from app.orchestrator import AgentArtifact
    from tests.support.agents import Clock

    clock = Clock(datetime.now(UTC))
    settings = dataclasses.replace(settings, agent_lane_limit=1, agent_batch_size=1, backoff_base_s=60,
                                   backoff_max_s=60, delayed_hint_max_s=0.0)
    orch, pub = Orchestrator(engine, settings, clock=clock), RecordingPublisher()
    providers = Providers(settings)
    pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8500)).hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    [claim_a] = orch.claim_agent_batch(hint_a.task_id, 1, "w1")
    assert [h for h in orch.fail_task(claim_a, RetryableError("provider busy")) if h.lane == "agent"] == []
    assert rows(engine, "SELECT status, last_hint_at FROM tasks WHERE id = :t", t=hint_a.task_id) == [("queued", None)]

    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8501)).hints)
    hint_b1 = step(orch, providers, pub, stop_lane="agent")
    [claim_b1] = orch.claim_agent_batch(hint_b1.task_id, 1, "w2")  # B served after A
    orch.complete_tasks([(claim_b1, AgentArtifact({"title": "t", "tags": []}, "m", claim_b1.attempt_id))])
    pub.drain()
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8502)).hints)
    hint_b2 = step(orch, providers, pub, stop_lane="agent")
    clock.advance(seconds=120)  # A's backoff is over: due, and unhinted

    hints: list = []
    assert orch.claim_agent_batch(hint_b2.task_id, 1, "w3", hints_out=hints) == []  # A is fairer: refused

    assert [h.task_id for h in hints] == [hint_a.task_id]
    assert rows(engine, "SELECT last_hint_at IS NOT NULL FROM tasks WHERE id = :t", t=hint_a.task_id) == [(True,)]
    assert len(orch.claim_agent_batch(hint_a.task_id, 1, "w4")) == 1


def test_a_refusal_waits_out_a_slot_release_in_flight_then_hints_the_freed_slot(engine, settings, monkeypatch):
    """Lane limit 1. A's first agent task holds the slot; a release of it is in flight (its
    transaction updated the slot row and — having read every waiting task as hinted — hints no
    one). A's second task's claim comes now: no free slot, refused, its hint cleared. Deciding on
    its own snapshot the refusal would see the slot still held and hint no one either: a free slot
    and an unhinted task, for the sweep. It must wait the release out, then hint the task."""
    import threading

    from app.orchestrator import lanes

    # the release is held open until the test sees the refusal wait for it: a budget that no loaded
    # box outlasts (the budget's own test: test_a_refusal_does_not_stall_on_a_long_transaction…)
    monkeypatch.setattr(lanes, "SETTLE_BUDGET_S", 60.0)
    settings = dataclasses.replace(settings, agent_lane_limit=1, agent_batch_size=1)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    hints = []
    for i in range(2):
        pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8600 + i)).hints)
        hints.append(step(orch, providers, pub, stop_lane="agent"))
    [claim] = orch.claim_agent_batch(hints[0].task_id, 1, "w1")

    release = engine.connect()
    tx = release.begin()
    release.execute(text("UPDATE lane_slots SET task_id = NULL, claim_generation = NULL, lease_expires_at = NULL"
                         " WHERE task_id = :t"), {"t": claim.task_id})
    out: dict = {}

    def refused_claim():
        got: list = []
        out["claims"] = orch.claim_agent_batch(hints[1].task_id, 1, "w2", hints_out=got)
        out["hints"] = got

    worker = threading.Thread(target=refused_claim)
    worker.start()
    try:
        poll_until(lambda: rows(engine, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                        " AND wait_event_type = 'Lock'")[0][0] >= 1,
                   timeout=30, what="the refusal waiting for the release in flight")
        assert rows(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=hints[1].task_id) == [(None,)]
    finally:
        tx.commit()
        release.close()
        worker.join(timeout=30)

    assert out["claims"] == []  # refused: the slot was being released, not free yet
    assert [h.task_id for h in out["hints"]] == [hints[1].task_id]
    assert len(orch.claim_agent_batch(hints[1].task_id, 1, "w3")) == 1


def test_a_worker_stopping_on_a_cancel_hands_its_slot_to_the_waiting_scope(engine, settings):
    """Lane limit 1: tenant A's agent task runs, tenant B's claim is refused (B waits unhinted). A's
    job is cancelled and its worker stops on the request (``abandon_task``): the slot frees, and
    B's task must be hinted by that transaction, published by the worker after the commit — as
    every other path that frees a slot does — not left idle until the sweep."""
    settings = dataclasses.replace(settings, agent_lane_limit=1)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    a = store_and_ingest(orch, "tenant-a", png_bytes(8500))
    pub.publish(a.hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8501)).hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    [claim_a] = orch.claim_agent_batch(hint_a.task_id, 1, "w1")
    assert orch.claim_agent_batch(hint_b.task_id, 1, "w2") == []  # the one slot is A's: refused
    orch.cancel_job("tenant-a", a.job["id"])  # running: its worker sees the request at its next beat

    hints = orch.abandon_task(claim_a)

    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=claim_a.task_id) == [("cancelled",)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    assert [h.task_id for h in hints or [] if h.lane == "agent"] == [hint_b.task_id]
    assert len(orch.claim_agent_batch(hint_b.task_id, 1, "w2")) == 1


def test_a_died_shared_run_re_claimed_takes_over_its_slot_and_its_delete_frees_one(engine, settings):
    """Lane limit 2. A shared agent claim (a threads pool: ``claimed_alone`` false) holds slot 1 while
    slot 0 is free; its worker dies, and its re-claim is not charged (``attempt_count`` stays 1). The
    admission decided "first claim" by that count, so the re-claim took a second slot (0) in one
    statement while slot 1 still named the task at its old generation (lease expired: free, left to
    the sweep). Deleting the image then counted two freed slots: it hinted two waiting tasks where
    one slot was freed and the other was already covered by a live hint — one empty claim later.
    The re-claim must take over the slot it holds (one row names the task, at the new generation)."""
    import uuid
    from datetime import UTC, datetime

    from app.orchestrator import AgentArtifact
    from tests.support.agents import Clock

    clock = Clock(datetime.now(UTC))
    settings = dataclasses.replace(settings, agent_lane_limit=2, agent_batch_size=1, backoff_base_s=600,
                                   backoff_max_s=600,
                                   delayed_hint_max_s=0.0)  # retries left unhinted, as before delayed hints
    orch, pub = Orchestrator(engine, settings, clock=clock), RecordingPublisher()
    providers = Providers(settings)

    def agent_hint(scope: str, seed: int):
        ingested = store_and_ingest(orch, scope, png_bytes(seed))
        pub.publish(ingested.hints)
        hint = step(orch, providers, pub, stop_lane="agent")
        assert hint is not None
        return ingested, hint

    _, hint_y = agent_hint("tenant-a", 8700)
    [claim_y] = orch.claim_agent_batch(hint_y.task_id, 1, "w-y")  # slot 0
    x, hint_x = agent_hint("tenant-b", 8701)
    assert len(orch.claim_agent_batch(hint_x.task_id, 1, "w-x", shared=True)) == 1  # slot 1
    orch.complete_tasks([(claim_y, AgentArtifact({"title": "t", "tags": []}, "m", claim_y.attempt_id))])
    waiting = []  # two scopes' tasks requeued by a retryable failure: unhinted, due after the backoff
    for scope, seed in (("tenant-c", 8702), ("tenant-d", 8703)):
        _, hint = agent_hint(scope, seed)
        [claim] = orch.claim_agent_batch(hint.task_id, 1, f"w-{scope}")
        orch.fail_task(claim, RetryableError("provider busy"))
        waiting.append(hint.task_id)
    assert rows(engine, "SELECT slot_no FROM lane_slots WHERE task_id = :t", t=hint_x.task_id) == [(1,)]

    clock.advance(seconds=settings.lease_s + 1)  # the shared run died: its lease lapsed
    [again] = orch.claim_agent_batch(hint_x.task_id, 1, "w-x2", shared=True)
    assert (again.generation, again.attempt_count) == (2, 1)  # re-claimed without charge
    assert rows(engine, "SELECT slot_no, claim_generation FROM lane_slots WHERE task_id = :t",
                t=hint_x.task_id) == [(1, 2)], "the re-claim must take over its slot, not take a second one"

    _, hint_h = agent_hint("tenant-b", 8704)  # its live hint covers the one free slot
    clock.advance(seconds=600)  # the retries are due
    assert orch.heartbeat(again)
    assert rows(engine, "SELECT count(*) FROM tasks WHERE id = ANY(:t) AND status = 'queued'"
                        " AND last_hint_at IS NULL", t=waiting) == [(2,)]

    hints = orch.delete_image("tenant-b", uuid.UUID(x.image["id"]))

    # one slot freed: the fairest waiting task (tenant-c, served longest ago) gets it; the other free
    # slot is already tenant-b's hinted task's
    assert [h.task_id for h in hints if h.lane == "agent"] == [waiting[0]]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    assert hint_h.task_id not in waiting


def test_deleting_an_image_whose_task_died_holding_a_slot_hands_on_nothing(engine, settings):
    """Lane limit 1. Tenant B's agent task holds the slot and its worker dies: once the lease
    expired the slot is free already (TAKE_FREE's rule), and the live hint of B's next task covers
    it. Deleting B's first image then frees no slot — but the delete counted every slot row naming
    the image's tasks, expired or not, and handed the "freed" slot to tenant C's due, unhinted retry
    (fairer than B): a second hint for one slot (one empty claim later)."""
    import uuid
    from datetime import UTC, datetime

    from tests.support.agents import Clock

    clock = Clock(datetime.now(UTC))
    settings = dataclasses.replace(settings, agent_lane_limit=1, agent_batch_size=1, backoff_base_s=600,
                                   backoff_max_s=600,
                                   delayed_hint_max_s=0.0)  # retries left unhinted, as before delayed hints
    orch, pub = Orchestrator(engine, settings, clock=clock), RecordingPublisher()
    providers = Providers(settings)

    def agent_hint(scope: str, seed: int):
        ingested = store_and_ingest(orch, scope, png_bytes(seed))
        pub.publish(ingested.hints)
        hint = step(orch, providers, pub, stop_lane="agent")
        assert hint is not None
        return ingested, hint

    _, hint_c = agent_hint("tenant-c", 8900)
    [claim_c] = orch.claim_agent_batch(hint_c.task_id, 1, "w-c")
    orch.fail_task(claim_c, RetryableError("provider busy"))  # requeued: unhinted, due after the backoff
    x, hint_x = agent_hint("tenant-b", 8901)
    assert len(orch.claim_agent_batch(hint_x.task_id, 1, "w-x")) == 1  # the one slot
    clock.advance(seconds=settings.lease_s + 1)  # B's worker died: its lease lapsed, the slot is free
    _, hint_h = agent_hint("tenant-b", 8902)  # its live hint covers the free slot
    clock.advance(seconds=600)  # C's retry is due
    assert rows(engine, "SELECT status, last_hint_at FROM tasks WHERE id = :t", t=hint_c.task_id) == [("queued", None)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id = :t", t=hint_x.task_id) == [(1,)]

    hints = orch.delete_image("tenant-b", uuid.UUID(x.image["id"]))

    assert [h.task_id for h in hints if h.lane == "agent"] == [], "the delete freed no slot: it hands on none"
    assert rows(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=hint_c.task_id) == [(None,)]
    assert rows(engine, "SELECT last_hint_at IS NOT NULL FROM tasks WHERE id = :t", t=hint_h.task_id) == [(True,)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]


def test_a_refusal_does_not_stall_on_a_long_transaction_holding_a_candidate_task(engine, settings):
    """Lane limit 1, the slot free. Tenant A's retry is due and unhinted; tenant B's claim is
    refused (A, served less recently, waits). The refusal then waits out the transactions in flight
    holding a candidate row locked — but a long one (a batch seeding page) holds A's row: each wait
    was bounded only by the engine's lock_timeout (10 s, up to 8 of them), stalling the refused
    claim's worker thread. The step is best effort (the sweep repairs): it must give up within its
    short budget, hint nothing it could not decide, and leave the state correct."""
    import threading
    import time
    from datetime import UTC, datetime

    from app.orchestrator import AgentArtifact
    from tests.support.agents import Clock

    clock = Clock(datetime.now(UTC))
    settings = dataclasses.replace(settings, agent_lane_limit=1, agent_batch_size=1, backoff_base_s=60,
                                   backoff_max_s=60,
                                   delayed_hint_max_s=0.0)  # retries left unhinted, as before delayed hints
    orch, pub = Orchestrator(engine, settings, clock=clock), RecordingPublisher()
    providers = Providers(settings)
    pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8800)).hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    [claim_a] = orch.claim_agent_batch(hint_a.task_id, 1, "w1")
    orch.fail_task(claim_a, RetryableError("provider busy"))
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8801)).hints)
    hint_b1 = step(orch, providers, pub, stop_lane="agent")
    [claim_b1] = orch.claim_agent_batch(hint_b1.task_id, 1, "w2")  # B served after A
    orch.complete_tasks([(claim_b1, AgentArtifact({"title": "t", "tags": []}, "m", claim_b1.attempt_id))])
    pub.drain()
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8802)).hints)
    hint_b2 = step(orch, providers, pub, stop_lane="agent")
    clock.advance(seconds=120)  # A's backoff is over: due, unhinted, and the refusal's candidate
    assert rows(engine, "SELECT status, last_hint_at FROM tasks WHERE id = :t", t=hint_a.task_id) == [("queued", None)]

    holder = engine.connect()
    tx = holder.begin()
    holder.execute(text("SELECT 1 FROM tasks WHERE id = :t FOR UPDATE"), {"t": hint_a.task_id}).all()
    out: dict = {}

    def refused_claim():
        got: list = []
        out["claims"] = orch.claim_agent_batch(hint_b2.task_id, 1, "w3", hints_out=got)
        out["hints"] = got

    worker = threading.Thread(target=refused_claim)
    started = time.monotonic()
    worker.start()
    try:
        worker.join(timeout=5)
        returned = not worker.is_alive()
    finally:
        tx.rollback()  # the long transaction ends (only now, whatever the refusal did)
        holder.close()
        worker.join(timeout=30)
    assert returned, f"the refused claim was still waiting after {time.monotonic() - started:.1f} s"

    assert out["claims"] == []  # refused: A is fairer
    # A's row was locked throughout: nothing could be decided for it, so nothing was hinted
    assert out["hints"] == []
    assert rows(engine, "SELECT status, last_hint_at FROM tasks WHERE id = ANY(:t) ORDER BY id",
                t=[hint_a.task_id, hint_b2.task_id]) == [("queued", None), ("queued", None)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    # the next event repairs it: the next refusal's settle step (nothing locked now) hints A
    hints: list = []
    assert orch.claim_agent_batch(hint_b2.task_id, 1, "w4", hints_out=hints) == []
    assert [h.task_id for h in hints] == [hint_a.task_id]
    assert len(orch.claim_agent_batch(hint_a.task_id, 1, "w5")) == 1
