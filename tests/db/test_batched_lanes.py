"""Batched lanes: a live hint drains a batch, completed in one transaction with each claim fenced
on its own; a stale hint drains nothing. Wake-up groups: one hint wakes the tasks a batch created
together, in every lane (the agent lane as far as its slots allow). And the agent lane's
freed-slot hints."""

from __future__ import annotations

import dataclasses
import re
import uuid

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.types import AgentArtifact
from app.stages.providers import Providers
from app.worker import executor
from app.worker.run import handle_hint
from tests.support.clock import FakeClock
from tests.support.pipeline import bulk_jobs_with_tasks, png_bytes, store_and_ingest, visual_task


def _scalar(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar()


def _ingest(orch, seeds, scope="local"):
    return [visual_task(store_and_ingest(orch, scope, png_bytes(s))) for s in seeds]


class _Commits:
    """Counts the commits an engine sends while active."""

    def __init__(self, engine):
        self.n = 0
        event.listen(engine, "commit", self._on)
        self.engine = engine

    def _on(self, conn):
        self.n += 1

    def close(self):
        event.remove(self.engine, "commit", self._on)


def test_a_live_visual_hint_drains_the_due_batch_in_two_transactions(engine, settings):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    orch.ensure_vector_index("visual_embeddings", "deterministic-v1", 64)  # first-model DDL out of the way
    hints = _ingest(orch, range(10, 15))
    pub = RecordingPublisher()
    commits = _Commits(engine)
    try:
        claimed = handle_hint(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub)
    finally:
        commits.close()
    assert claimed == 5
    assert commits.n == 2  # one claim transaction, one completion transaction for all five
    assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 5
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'visual' AND status = 'succeeded'") == 5
    # one hint per wake-up group of at most the agent lane's batch size (4 here): 5 new tasks → 2 hints
    hinted = [h.task_id for h in pub.drain() if h.lane == "agent"]
    assert len(hinted) == 2
    groups = _rows(engine, "SELECT coalesce(hint_group, id), count(*) FROM tasks WHERE lane = 'agent'"
                           " GROUP BY 1 ORDER BY 2 DESC")
    assert [(g, n) for g, n in groups] == [(hinted[0], 4), (hinted[1], 1)]
    assert _scalar(engine, "SELECT count(*) FROM processing_jobs WHERE current_stage = 'agent'") == 5


def test_a_stale_or_unknown_hint_drains_nothing_even_with_due_work(engine, settings):
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    first = _ingest(orch, [20, 21])
    assert handle_hint(orch, "visual", first[0].task_id, "w1", providers, RecordingPublisher()) == 2
    due = _ingest(orch, [22, 23])  # queued and due, each with a hint of its own
    for stale in (first[0].task_id, first[1].task_id, uuid.uuid4()):
        assert handle_hint(orch, "visual", stale, "w2", providers, RecordingPublisher()) == 0
    # a wrong-lane hint names a real due task: not claimable from the embedding queue either
    assert handle_hint(orch, "embedding", due[0].task_id, "w2", providers, RecordingPublisher()) == 0
    rows = {r[0]: (r[1], r[2]) for r in _rows(engine, "SELECT id, status, claim_generation FROM tasks"
                                               " WHERE id = ANY(:ids)", ids=[h.task_id for h in due])}
    assert rows == {h.task_id: ("queued", 0) for h in due}


def _rows(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).all()


def test_a_fenced_out_claim_does_not_stop_the_rest_of_its_batch(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    providers = Providers(settings)
    hints = _ingest(orch, [30, 31, 32])
    claims = orch.claim_with_batch(hints[0].task_id, "visual", 16, "old").claims
    assert len(claims) == 3
    artifacts = [executor.execute_visual(settings, providers, c) for c in claims]
    clock.advance(settings.lease_s + 1)  # the old worker stalled past its lease ...
    taken = orch.claim_task(claims[1].task_id, "new")  # ... and another worker re-claimed one task
    assert taken is not None and taken.generation == claims[1].generation + 1

    hints_out = orch.complete_tasks(list(zip(claims, artifacts, strict=True)))

    # the two claims still held landed and advanced their jobs (two agent tasks, one wake-up group)
    assert len(hints_out) == 1
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent'") == 2
    landed = {r[0] for r in _rows(engine, "SELECT task_id FROM visual_embeddings")}
    assert landed == {claims[0].task_id, claims[2].task_id}
    assert _rows(engine, "SELECT status, lease_owner FROM tasks WHERE id = :t", t=claims[1].task_id) == [
        ("running", "new")
    ]
    assert _scalar(engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'") == 1
    # the new owner completes its task normally
    assert len(orch.complete_task(taken, artifacts[1])) == 1
    assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 3


def test_an_undecodable_image_fails_alone_in_its_visual_batch(engine, settings):
    orch = Orchestrator(engine, settings)
    hints = _ingest(orch, [40, 41, 42])
    bad_key = _scalar(engine, "SELECT i.storage_key FROM images i JOIN tasks t ON t.image_id = i.id"
                              " WHERE t.id = :t", t=hints[1].task_id)
    # broken on disk after its upload: the worker's content check refuses it before decoding
    (settings.storage_path / bad_key).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    pub = RecordingPublisher()
    assert handle_hint(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub) == 3
    status = dict(_rows(engine, "SELECT id, status FROM tasks WHERE lane = 'visual'"))
    assert status == {hints[0].task_id: "succeeded", hints[1].task_id: "failed", hints[2].task_id: "succeeded"}
    assert _scalar(engine, "SELECT error->>'code' FROM tasks WHERE id = :t", t=hints[1].task_id) == "file_corrupt"
    assert sorted(r[0] for r in _rows(engine, "SELECT status FROM processing_jobs")) == ["failed", "running", "running"]
    assert [h.lane for h in pub.drain()] == ["agent"]  # the two agent tasks: one wake-up group
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent'") == 2


def test_a_freed_agent_slot_hints_only_a_task_that_waits_unhinted(engine, settings):
    settings = dataclasses.replace(settings, agent_lane_limit=1)
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    pub = RecordingPublisher()
    visual = _ingest(orch, [50, 51])
    handle_hint(orch, "visual", visual[0].task_id, "w1", providers, pub)
    agent_a, agent_b = (h.task_id for h in pub.drain())

    a = orch.claim_task(agent_a, "w1", "agent")
    assert a is not None
    assert orch.claim_task(agent_b, "w2", "agent") is None  # refused: the only slot is taken
    assert _scalar(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=agent_b) is None  # waits unhinted
    # a later job's agent task, queued with a live hint of its own
    (later,) = _ingest(orch, [52])
    handle_hint(orch, "visual", later.task_id, "w1", providers, pub)
    [agent_c] = [h.task_id for h in pub.drain()]

    def finish(claim):
        return orch.complete_task(claim, AgentArtifact({"title": "t", "tags": []}, "m", claim.attempt_id))

    # the freed slot goes to the task that lost its hint (the fairest: oldest of the scope)
    assert sorted(h.task_id for h in finish(a) if h.lane == "agent") == [agent_b]
    assert _scalar(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=agent_b) is not None

    b = orch.claim_task(agent_b, "w2", "agent")
    assert b is not None
    # every waiting agent task (c) has a live hint, and the job's next stage joins the queued
    # embedding task of job a (one hint wakes both): the completion publishes nothing
    assert finish(b) == []
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'embedding' AND hint_group IS NOT NULL") == 1
    assert orch.claim_task(agent_c, "w3", "agent") is not None


def test_the_freed_slot_check_does_not_scan_a_queued_agent_backlog(engine, settings):
    """The 'does a due task wait unhinted?' question of every agent completion visits only the
    unhinted tasks (the NULL end of ix_tasks_rehint), not the 50k queued (hinted) agent tasks —
    with the custom plan and with the generic plan a prepared statement may switch to."""
    from datetime import datetime, timezone

    from app.orchestrator.store import slots

    orch = Orchestrator(engine, settings)
    store_and_ingest(orch, "local", png_bytes(60))
    with engine.begin() as conn:
        bulk_jobs_with_tasks(conn, 50000, lane="agent", task_status="queued")
    captured: list = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        captured.append((statement, parameters))

    with engine.connect() as conn:
        event.listen(engine, "before_cursor_execute", capture)
        try:
            assert slots.unhinted_waiting_txn(conn, "agent", datetime.now(timezone.utc)) is False
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        (statement, parameters), = captured
        custom = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
        # psycopg 3 prepares hot statements, and PostgreSQL may then run a generic plan: check it too
        conn.exec_driver_sql("PREPARE unhinted(text, timestamptz) AS " + statement.replace("%(lane)s", "$1")
                             .replace("%(now)s", "$2"))
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        generic = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN EXECUTE unhinted('agent', now())"))
    for plan in (custom, generic):
        assert re.search(r"ix_tasks_rehint[^\n]*\n\s+Index Cond: \(last_hint_at IS NULL\)", plan), plan
        assert "Seq Scan" not in plan and "ix_tasks_queued_due" not in plan and "ix_tasks_claimable" not in plan, plan


def _agent_group(orch, engine, settings, seeds):
    """Ingest and run the visual stage of ``seeds`` in one batch; returns the agent hints it published."""
    pub = RecordingPublisher()
    hints = _ingest(orch, seeds)
    assert handle_hint(orch, "visual", hints[0].task_id, "w0", Providers(settings), pub) == len(seeds)
    return [h for h in pub.drain() if h.lane == "agent"]


def test_one_agent_hint_runs_its_whole_group_in_one_claim_and_one_completion(engine, settings):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    [hint] = _agent_group(orch, engine, settings, [70, 71, 72])
    pub = RecordingPublisher()
    commits = _Commits(engine)
    try:
        assert handle_hint(orch, "agent", hint.task_id, "w1", Providers(settings), pub) == 3
    finally:
        commits.close()
    assert commits.n == 2  # claim (3 tasks, 3 slots, 3 attempts committed) + one completion
    assert _rows(engine, "SELECT state, count(*) FROM task_attempts GROUP BY 1") == [("completed", 3)]
    assert _rows(engine, "SELECT state, count(*) FROM operation_grants GROUP BY 1") == [("committed", 3)]
    assert _scalar(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == 0  # all released
    assert [h.lane for h in pub.drain()] == ["embedding"]  # their three embedding tasks: one group
    assert handle_hint(orch, "embedding", _scalar(engine, "SELECT id FROM tasks WHERE lane = 'embedding'"
                                                          " AND hint_group IS NULL"), "w1",
                       Providers(settings), pub) == 3
    assert _rows(engine, "SELECT status, count(*) FROM processing_jobs GROUP BY 1") == [("succeeded", 3)]


def test_an_agent_group_larger_than_the_free_slots_waits_unhinted_for_the_next_slot(engine, settings):
    settings = dataclasses.replace(settings, agent_lane_limit=4, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    [hint] = _agent_group(orch, engine, settings, [80, 81, 82, 83])
    other = _agent_group(orch, engine, settings, [84])[0]
    blocker = orch.claim_task(other.task_id, "w9", "agent")  # holds one of the four slots
    assert blocker is not None

    claims = orch.claim_agent_batch(hint.task_id, 4, "w1")
    assert len(claims) == 3  # three free slots: the hinted task and two of its group
    left = _rows(engine, "SELECT id, last_hint_at FROM tasks WHERE hint_group = :g AND status = 'queued'",
                 g=hint.task_id)
    assert len(left) == 1 and left[0][1] is None  # its hint is spent: it waits unhinted
    assert _scalar(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == 4
    assert len({_scalar(engine, "SELECT slot_no FROM lane_slots WHERE task_id = :t", t=c.task_id)
                for c in claims}) == 3  # each claim holds a slot of its own

    def finish(claim):
        return orch.complete_task(claim, AgentArtifact({"title": "t", "tags": []}, "m", claim.attempt_id))

    hints = finish(claims[0])
    assert sorted(h.task_id for h in hints if h.lane == "agent") == [left[0][0]]  # the freed slot wakes it
    pub = RecordingPublisher()
    assert handle_hint(orch, "agent", left[0][0], "w2", providers, pub) == 1


def test_a_hint_whose_task_was_taken_still_wakes_its_queued_group(engine, settings):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    pub = RecordingPublisher()
    [hint] = _agent_group(orch, engine, settings, [90, 91, 92])
    leader = hint.task_id
    members = {r[0] for r in _rows(engine, "SELECT id FROM tasks WHERE hint_group = :g", g=leader)}
    assert len(members) == 2
    assert orch.claim_task(leader, "w2", "agent") is not None  # run alone (e.g. by a sweep re-hint)
    assert handle_hint(orch, "agent", leader, "w3", providers, pub) == 2  # its group is not stranded
    assert {r[0] for r in _rows(engine, "SELECT id FROM tasks WHERE lease_owner = 'w3'")} == members
    assert handle_hint(orch, "agent", leader, "w3", providers, pub) == 0  # nothing left: changes nothing

    # the same in a batched lane: w3's two completions made one embedding group
    [emb] = [h for h in pub.drain() if h.lane == "embedding"]
    member = _scalar(engine, "SELECT id FROM tasks WHERE hint_group = :g", g=emb.task_id)
    assert orch.claim_task(emb.task_id, "w4", "embedding") is not None
    assert handle_hint(orch, "embedding", emb.task_id, "w5", providers, pub) == 1
    assert _rows(engine, "SELECT status, lease_owner FROM tasks WHERE id = :t", t=member) == [("succeeded", "w5")]
    assert handle_hint(orch, "embedding", emb.task_id, "w5", providers, pub) == 0


def test_wake_groups_split_by_lane_scope_and_resource_key_and_batch_size(settings):
    from app.orchestrator.advance import _wake_groups

    settings = dataclasses.replace(settings, agent_batch_size=2, agent_lane_limit=8, embedding_batch_size=4)
    orch = Orchestrator(None, settings)
    rows = [{"id": i, "lane": lane, "scope_id": scope, "resource_key": "", "hint_group": None}
            for i, (lane, scope) in enumerate([("agent", "a")] * 5 + [("agent", "b")] + [("embedding", "a")] * 4)]
    groups = _wake_groups(orch, rows)
    # a batched lane's group leaves room in its claim for the fair fill (lanes.wake_group_size): 4 - 1
    assert [[r["id"] for r in g] for g in groups] == [[0, 1], [2, 3], [4], [5], [6, 7, 8], [9]]
    assert [r["hint_group"] for r in rows] == [None, 0, None, 2, None, None, None, 6, 6, None]


def test_a_batch_asks_a_quota_policy_per_task_and_blocks_only_the_denied_jobs(engine, settings):
    from tests.support.agents import CountingPolicy

    settings = dataclasses.replace(settings, agent_batch_size=4)
    policy = CountingPolicy(limit_per_day=2)
    orch = Orchestrator(engine, settings, policy=policy)
    [hint] = _agent_group(orch, engine, settings, [100, 101, 102, 103])  # one completion, four jobs
    assert len(policy.acquired) == 2 and len(policy.denied) == 2
    assert sorted(r[0] for r in _rows(engine, "SELECT status FROM processing_jobs")) == [
        "blocked", "blocked", "running", "running"
    ]
    assert _scalar(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent'") == 2  # one group, one hint
    assert handle_hint(orch, "agent", hint.task_id, "w1", Providers(settings), RecordingPublisher()) == 2
    # a custom policy's commit is called once per grant (not the built-in one-statement commit)
    assert sorted(policy.committed.values()) == [1, 1]
    assert _rows(engine, "SELECT state, count(*) FROM operation_grants GROUP BY 1") == [("committed", 2)]
    assert _scalar(engine, "SELECT count(*) FROM tasks t JOIN operation_grants g ON g.id = t.grant_id"
                           " AND g.task_id = t.id") == 2  # each grant bound both ways by the set-based insert


def test_clearing_a_spent_hint_skips_rows_another_transaction_holds(engine, settings):
    """Waiting there (inside an agent claim that already holds its fairness row) closed lock
    cycles with other claimers; the row's holder is claiming or hinting it anyway."""
    from app.orchestrator.store import tasks as task_store

    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    [hint] = _agent_group(orch, engine, settings, [110, 111, 112])
    held, free = (r[0] for r in _rows(engine, "SELECT id FROM tasks WHERE hint_group = :g ORDER BY id",
                                      g=hint.task_id))
    with engine.connect() as other:
        other.execute(text("SELECT id FROM tasks WHERE id = :t FOR UPDATE"), {"t": held})
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))  # a wait would fail here
            task_store.clear_hint_txn(conn, hint.task_id)
        other.rollback()
    hinted = dict(_rows(engine, "SELECT id, last_hint_at IS NOT NULL FROM tasks WHERE lane = 'agent'"))
    assert hinted == {hint.task_id: False, free: False, held: True}


def test_a_new_job_links_to_the_identical_task_a_cancelled_job_still_runs(engine, settings):
    """The dedupe path of the set-based task insert: no second task, no hint; the running task's
    completion advances the new job."""
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(130))
    claim = orch.claim_task(visual_task(res).task_id, "w1", "visual")
    assert claim is not None
    orch.cancel_job("local", res.job["id"])  # its visual task keeps running (cancel requested)
    again = orch.request_processing("local", res.image["id"])
    assert again.created and again.hints == []
    assert _rows(engine, "SELECT id, status FROM tasks") == [(claim.task_id, "running")]
    assert _rows(engine, "SELECT status, task_id FROM job_stages WHERE job_id = :j AND stage = 'visual'",
                 j=again.job["id"]) == [("running", claim.task_id)]
    hints = orch.complete_task(claim, executor.execute_visual(settings, providers, claim))
    assert [h.lane for h in hints] == ["agent"]
    assert _scalar(engine, "SELECT current_stage FROM processing_jobs WHERE id = :j", j=again.job["id"]) == "agent"
