"""Operation policy, agent lane limits and fairness, library batches, reverse_image_policy
(SPEC §4.6, §4.8, §4.10) — on a real PostgreSQL, with real worker threads where it races."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from app.orchestrator import AgentArtifact, GenerationPolicyConflict, Orchestrator, RecordingPublisher
from app.orchestrator import fingerprints as fp
from tests.conftest import poll_until
from tests.support.agents import Clock, CountingAgent, CountingPolicy, providers_with, rows
from tests.support.pipeline import Workers, png_bytes, store_and_ingest

T0 = datetime(2030, 1, 1, 22, 0, tzinfo=timezone.utc)


def _wait_terminal(orch, job_id, timeout=30):
    return poll_until(lambda: (j := orch.get_job("local", job_id))["status"] not in ("queued", "running") and j,
                      timeout=timeout, what=f"job {job_id} terminal")


# ----------------------------------------------------------------------------- operation policy
def test_quota_blocks_the_fourth_job_until_an_explicit_retry_after_reset(engine, settings):
    clock, policy = Clock(T0), CountingPolicy(limit_per_day=3)
    orch = Orchestrator(engine, settings, clock=clock, policy=policy)
    pub = RecordingPublisher()
    with Workers(orch, pub, n=3):
        done = []
        for i in range(4):
            res = store_and_ingest(orch, "local", png_bytes(i))
            pub.publish(res.hints)
            done.append(_wait_terminal(orch, res.job["id"]))
    assert [j["status"] for j in done] == ["succeeded"] * 3 + ["blocked"]
    blocked = done[3]
    reset = "2030-01-02T00:00:00+00:00"
    assert blocked["error"]["code"] == "operation_limit_exceeded" and blocked["retry_at"] == reset
    assert [s["status"] for s in blocked["stages"]] == ["succeeded", "blocked", "pending"]
    assert blocked["stages"][1]["retry_at"] == reset and blocked["stages"][1]["task_id"] is None
    # past retry_at, sweeps do not wake it (a human decides)
    clock.advance(hours=3)
    for _ in range(2):
        orch.sweep()
    assert orch.get_job("local", blocked["id"]) == blocked
    assert rows(engine, "SELECT count(*) FROM tasks WHERE stage = 'agent'") == [(3,)]
    # the explicit retry acquires again; the new day has quota
    pub = RecordingPublisher()
    retried = orch.retry_job("local", blocked["id"])
    assert retried.created
    pub.publish(retried.hints)
    with Workers(orch, pub, n=2):
        assert _wait_terminal(orch, retried.job["id"])["status"] == "succeeded"
    # each logical agent task acquired once and committed once
    assert rows(engine, "SELECT state, count(*) FROM operation_grants GROUP BY state") == [("committed", 4)]
    assert sorted(policy.acquired.values()) == [1, 1, 1, 1] and sorted(policy.committed.values()) == [1, 1, 1, 1]
    assert len(policy.denied) == 1
    assert rows(engine, "SELECT count(*) FROM tasks t JOIN operation_grants g ON g.id = t.grant_id"
                        " AND g.task_id = t.id WHERE t.stage = 'agent'") == [(4,)]


def test_a_task_cancelled_before_any_attempt_releases_its_grant(engine, settings):
    orch = Orchestrator(engine, settings, policy=CountingPolicy(limit_per_day=1))
    pub = RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(1))
    pub.publish(res.hints)
    from app.stages.providers import Providers
    from tests.support.agents import step

    hint = step(orch, Providers(settings), pub, stop_lane="agent")
    assert hint is not None
    assert rows(engine, "SELECT state FROM operation_grants") == [("acquired",)]
    orch.cancel_job("local", res.job["id"])
    assert rows(engine, "SELECT state FROM operation_grants") == [("released",)]
    # a released grant gives the quota back: a new explicit job in the same day is granted
    again = orch.retry_job("local", res.job["id"])
    assert again.job["stages"][1]["status"] == "queued"


# ----------------------------------------------------------------------------- lanes
class PairingAgent(CountingAgent):
    """Tracks concurrent calls; the first call waits (bounded) until a second one is inside, so
    "the limit was reached" is a fact of the run, not of how fast the box happened to be."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.in_flight = self.peak = 0
        self.paired = threading.Event()

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.in_flight >= 2:
                self.paired.set()
        try:
            self.paired.wait(timeout=60)
            return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_agent_lane_limit_two_holds_against_eight_racing_workers(engine, settings):
    settings = dataclasses.replace(settings, agent_lane_limit=2)
    orch = Orchestrator(engine, settings)
    agent = PairingAgent(results_dir=str(settings.agent_results_path), delay_s=0.1)
    pub, n = RecordingPublisher(), 40
    samples: list[tuple[int, int]] = []
    stop, sampling = threading.Event(), threading.Event()

    def sample():
        with engine.connect() as c:
            while not stop.is_set():
                samples.append(c.execute(text(
                    "SELECT (SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'running'),"
                    " (SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL AND resource_key = '*')"
                )).one())
                c.rollback()
                sampling.set()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    poll_until(sampling.is_set, timeout=30, what="the sampler running")
    try:
        for i in range(n):
            pub.publish(store_and_ingest(orch, "local", png_bytes(i)).hints)
        with Workers(orch, pub, n=8, providers=providers_with(settings, agent)):

            def all_done():
                pub.publish(orch.sweep().hints)  # refused claims drop their hint; the sweep re-hints
                return rows(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == n

            poll_until(all_done, timeout=120, interval=0.25, what="all jobs succeeded")
    finally:
        stop.set()
        sampler.join(timeout=5)
    # the DB-wide limit held in every sample, and two paid calls really ran at once (never three)
    assert max(r for r, _ in samples) <= 2 and max(s for _, s in samples) <= 2
    assert agent.paired.is_set() and agent.peak == 2
    assert agent.calls["describe"] == n
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]


def _seed_images(engine, orch, scope: str, n: int, *, agent_done: bool) -> None:
    """n tiny image rows (no files) whose visual stage (and optionally agent stage) is already valid."""
    configs = orch.stage_configs
    orch.ensure_scope(scope)
    ctx = {"title": "seeded", "description": "", "ocr_text": "", "tags": []}
    with engine.begin() as c:
        c.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " context, context_status, context_provenance, metadata_hash, created_at, updated_at)"
            " SELECT gen_random_uuid(), :s, encode(sha256((CAST(:s AS varchar) || g::text)::bytea), 'hex'), '.png', 'image/png', 1,"
            " 1, 1, 'none/' || g, CASE WHEN :done THEN CAST(:ctx AS jsonb) END,"
            " CASE WHEN :done THEN 'ready' ELSE 'pending' END,"
            " CASE WHEN :done THEN jsonb_build_object('image_sha256', encode(sha256((CAST(:s AS varchar) || g::text)::bytea), 'hex'),"
            "  'agent_config_hash', CAST(:ah AS text), 'reverse_image_policy', 'forbid') END,"
            " CASE WHEN :done THEN CAST(:mh AS text) END,"
            " now() + g * interval '1 microsecond', now() FROM generate_series(1, :n) g"
        ), {"s": scope, "n": n, "done": agent_done, "ctx": fp.canonical_json(ctx), "ah": configs.agent_hash,
            "mh": fp.metadata_hash(None, ctx)})
        v = configs.visual
        c.execute(text(
            "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
            " embedding) SELECT scope_id, id, sha256, :m, :pv, :d, CAST(array_fill(0.5::real, ARRAY[:d]) AS vector)"
            " FROM images WHERE scope_id = :s"
        ), {"s": scope, "m": v["model"], "pv": v["preprocess_version"], "d": int(v["dims"])})


def test_one_task_of_scope_b_is_dispatched_within_limit_dispatches_despite_a_2000_backlog(engine, settings):
    limit = 2
    settings = dataclasses.replace(settings, agent_lane_limit=limit, batch_page_size=2000,
                                   batch_backlog_threshold=10_000)
    orch = Orchestrator(engine, settings)
    _seed_images(engine, orch, "tenant-a", 2000, agent_done=False)
    _seed_images(engine, orch, "tenant-b", 1, agent_done=False)
    pub = RecordingPublisher()
    batch_a, hints = orch.create_batch("tenant-a", all=True)
    assert batch_a["total"] == 2000
    pub.publish(hints)
    running: list = []
    dispatched: list[str] = []
    refused = 0

    def dispatch_next():
        """A worker takes hints in broker order until one claim is admitted (publishing the hints
        its claims return, as the worker does: a free slot's, e.g. once a lease ran out)."""
        nonlocal refused
        while (hint := pub.take(timeout=0)) is not None:
            if hint.lane != "agent":
                continue
            more: list = []
            claim = orch.claim_task(hint.task_id, "w", hints_out=more)
            pub.publish(more)
            if claim is None:
                refused += 1
                continue
            running.append(claim)
            dispatched.append(claim.scope_id)
            return claim
        raise AssertionError("no dispatchable hint")

    for _ in range(limit):
        dispatch_next()
    assert dispatched == ["tenant-a"] * limit
    assert orch.claim_task(pub.take(timeout=0).task_id, "w") is None  # both slots busy
    _, hints_b = orch.create_batch("tenant-b", all=True)
    pub.publish(hints_b)  # B's hint is behind ~2,000 of A's
    after_b: list[str] = []
    for _ in range(limit + 1):
        claim = running.pop(0)
        pub.publish(orch.complete_task(claim, AgentArtifact({"title": "t", "tags": []}, "m", claim.attempt_id)))
        dispatch_next()
        after_b.append(dispatched[-1])
    assert "tenant-b" in after_b[:limit]
    assert after_b[-1] == "tenant-a"  # and A is served again right after: round-robin, not starvation
    assert refused > 1000  # A's stale hints were refused while B waited


# ----------------------------------------------------------------------------- batches
def _queued(engine) -> int:
    return rows(engine, "SELECT count(*) FROM tasks WHERE status = 'queued'")[0][0]


def test_batch_of_5000_seeds_in_pages_under_back_pressure_to_exact_completion(engine, settings):
    page, threshold, n = 250, 1000, 5000
    settings = dataclasses.replace(settings, batch_page_size=page, batch_backlog_threshold=threshold)
    orch = Orchestrator(engine, settings)
    _seed_images(engine, orch, "local", n, agent_done=True)  # only the text stage runs: no files needed
    batch, hints = orch.create_batch("local", all=True)
    assert batch["status"] == "seeding" and batch["total"] == n
    assert rows(engine, "SELECT count(*) FROM batch_items") == [(page,)]
    seeded, more = orch.seed_batch(batch["id"])
    hints += more
    assert _queued(engine) <= threshold + page
    assert rows(engine, "SELECT count(*) FROM batch_items") == [(page + seeded,)]
    assert orch.get_batch("local", batch["id"])["status"] == "seeding"  # paused, not finished
    assert orch.seed_batch(batch["id"]) == (0, [])  # still paused
    pub = RecordingPublisher()
    pub.publish(hints)
    peak = 0
    with Workers(orch, pub, n=4):
        last_sweep = 0.0

        def finished():
            nonlocal peak, last_sweep
            peak = max(peak, _queued(engine))
            if time.monotonic() - last_sweep > 0.5:
                last_sweep = time.monotonic()
                pub.publish(orch.sweep().hints)  # continues seeding when the backlog drains
            return orch.get_batch("local", batch["id"])["status"] == "completed"

        poll_until(finished, timeout=400, interval=0.05, what="batch completed")
    assert peak <= threshold + page
    done = orch.get_batch("local", batch["id"])
    assert done["progress"] == 1.0 and done["total"] == n and done["counts"] == {"succeeded": n}
    assert done["completed_at"] is not None
    assert rows(engine, "SELECT count(*), count(DISTINCT image_id) FROM batch_items") == [(n, n)]
    assert rows(engine, "SELECT count(*) FROM processing_jobs WHERE mode = 'explicit' AND batch_id IS NOT NULL"
                        " AND status = 'succeeded'") == [(n,)]
    assert rows(engine, "SELECT DISTINCT priority FROM tasks") == [(0,)]  # batch work yields to interactive


def test_cancelling_a_batch_mid_seeding_leaves_no_queued_work(engine, settings):
    settings = dataclasses.replace(settings, batch_page_size=200, batch_backlog_threshold=300)
    orch = Orchestrator(engine, settings)
    _seed_images(engine, orch, "local", 1200, agent_done=True)
    batch, _ = orch.create_batch("local", all=True)
    orch.seed_batch(batch["id"])
    assert _queued(engine) == 400
    cancelled = orch.cancel_batch("local", batch["id"])
    assert cancelled["status"] == "cancelled" and cancelled["counts"] == {"cancelled": 400}
    assert rows(engine, "SELECT count(*) FROM tasks t JOIN processing_jobs j ON j.id = t.job_id"
                        " WHERE j.batch_id = :b AND t.status = 'queued'", b=batch["id"]) == [(0,)]
    assert orch.seed_batch(batch["id"]) == (0, [])
    orch.sweep()
    assert rows(engine, "SELECT count(*) FROM batch_items") == [(400,)]
    assert orch.cancel_batch("local", batch["id"]) == cancelled  # finished: returned unchanged


def test_batch_over_explicit_ids_and_validation(engine, settings):
    from app.orchestrator import InvalidRequest, NotFound

    orch = Orchestrator(engine, settings)
    _seed_images(engine, orch, "local", 3, agent_done=True)
    ids = [r[0] for r in rows(engine, "SELECT id FROM images ORDER BY created_at")]
    with pytest.raises(InvalidRequest):
        orch.create_batch("local", all=True, image_ids=ids)
    with pytest.raises(NotFound):
        orch.create_batch("other-scope", image_ids=ids)  # another scope's ids are missing ids
    batch, hints = orch.create_batch("local", image_ids=[str(i) for i in ids[:2]])
    # the two jobs' embedding tasks share one wake-up group: one hint wakes both
    assert batch["total"] == 2 and batch["status"] == "running" and len(hints) == 1
    with pytest.raises(NotFound):
        orch.get_batch("other-scope", batch["id"])


# ----------------------------------------------------------------------------- reverse_image_policy
def test_reverse_image_policy_is_frozen_into_the_job_and_the_context(engine, settings):
    orch = Orchestrator(engine, settings)
    pub = RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(3))  # forbid (the default), job active
    with pytest.raises(GenerationPolicyConflict) as err:
        orch.request_processing("local", res.image["id"], reverse_image_policy="auto")
    assert err.value.code == "generation_policy_conflict"
    pub.publish(res.hints)
    with Workers(orch, pub, n=2):
        assert _wait_terminal(orch, res.job["id"])["status"] == "succeeded"
        task = orch.get_task("local", orch.get_job("local", res.job["id"])["stages"][1]["task_id"])
        prov = rows(engine, "SELECT context_provenance FROM images WHERE id = :i", i=res.image["id"])[0][0]
        assert prov["reverse_image_policy"] == "forbid"
        assert task["status"] == "succeeded"
        # a context made under forbid does not count for a job that allows reverse-image search
        auto = orch.request_processing("local", res.image["id"], reverse_image_policy="auto")
        assert auto.created and auto.job["reverse_image_policy"] == "auto"
        assert [s["status"] for s in auto.job["stages"]] == ["reused", "queued", "pending"]
        pub.publish(auto.hints)
        assert _wait_terminal(orch, auto.job["id"])["status"] == "succeeded"
    prov = rows(engine, "SELECT context_provenance FROM images WHERE id = :i", i=res.image["id"])[0][0]
    assert prov["reverse_image_policy"] == "auto"
    payloads = [r[0]["reverse_image_policy"] for r in rows(
        engine, "SELECT payload FROM tasks WHERE stage = 'agent' ORDER BY created_at")]
    assert payloads == ["forbid", "auto"]


def test_a_first_claim_takes_a_slot_in_every_pool_or_none(engine, settings):
    """The one-statement admission (slots.admit_first_txn) with two pools: the global lane limit
    and a per-resource-key limit of one. A claim refused for the full resource pool writes nothing
    — its global slot stays free — and the claim after the completion gets both."""
    from app.stages.providers import Providers
    from app.worker import executor, run
    from tests.support.agents import step

    settings = dataclasses.replace(settings, agent_lane_limit=4, agent_resource_limit=1)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    for i in range(2):
        pub.publish(store_and_ingest(orch, "local", png_bytes(7400 + i)).hints)
    hints = [step(orch, providers, pub, stop_lane="agent") for _ in range(2)]
    first = orch.claim_agent_batch(hints[0].task_id, 1, "w1")
    assert len(first) == 1
    held = "SELECT resource_key, count(*) FROM lane_slots WHERE task_id IS NOT NULL GROUP BY 1 ORDER BY 1"
    assert [n for _, n in rows(engine, held)] == [1, 1]  # one global ('*') slot and one of the key
    assert orch.claim_agent_batch(hints[1].task_id, 1, "w2") == []  # the key's pool is full: refused
    assert [n for _, n in rows(engine, held)] == [1, 1]  # nothing taken for the refused claim
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=hints[1].task_id) == [("queued",)]
    claim = first[0]
    with run.Heartbeat(orch, [claim]):
        artifact = executor.execute_agent(settings, providers, claim)
    freed = orch.complete_tasks([(claim, artifact)])
    assert rows(engine, held) == []  # the completion freed both
    assert rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t", t=claim.task_id) == [("completed",)]
    assert [h.task_id for h in freed if h.lane == "agent"] == [hints[1].task_id]  # the refused task, hinted
    assert len(orch.claim_agent_batch(hints[1].task_id, 1, "w2")) == 1
    assert [n for _, n in rows(engine, held)] == [1, 1]
