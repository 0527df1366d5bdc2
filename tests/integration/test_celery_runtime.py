"""The Celery runtime under real processes: hints are IDs, PostgreSQL decides (SPEC §2, §4.4, §4.9).

Every test runs real ``celery worker`` (and where needed ``celery beat``) processes against the
test's own database and Redis database index, with fast intervals and deterministic/counting
providers. Waits are deadline polls, never sleeps.
"""

from __future__ import annotations

import collections
import itertools
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import text

from app.embedded import EmbeddedServices
from tests.conftest import poll_until
from tests.integration.conftest import (
    CeleryCluster,
    Sweeper,
    ingest,
    job_statuses,
    make_publisher,
    wait_jobs_terminal,
)
from tests.integration.fakes import FaultyPublisher, read_calls, read_calls_by_pid

pytestmark = pytest.mark.slow

COUNTING = {
    "visual_provider": "tests.integration.fakes:CountingVisual",
    "agent_provider": "tests.integration.fakes:CountingAgent",
    "text_provider": "tests.integration.fakes:CountingText",
}
LANES = ("visual", "agent", "embedding")


def counting(cluster: CeleryCluster, **more) -> None:
    cluster.settings = cluster.settings.replace(**{**COUNTING, **more})


def make_orch(engine, settings):
    from app.orchestrator import Orchestrator

    return Orchestrator(engine, settings)


def calls_by_stage(call_log: Path) -> dict[str, collections.Counter]:
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for stage, key in read_calls(call_log):
        out[stage][key] += 1
    return out


def assert_each_stage_once(call_log: Path, n: int) -> None:
    calls = calls_by_stage(call_log)
    for stage in ("visual", "agent", "text"):
        assert len(calls[stage]) == n, f"{stage}: {len(calls[stage])} distinct inputs, expected {n}"
        repeated = {k: c for k, c in calls[stage].items() if c != 1}
        assert not repeated, f"{stage} provider invoked more than once for {repeated}"


def ingest_many(orch, settings, publisher, indices, **kwargs) -> list[uuid.UUID]:
    job_ids = []
    for i in indices:
        result = ingest(orch, settings, i, **kwargs)
        publisher.publish(result.hints)
        job_ids.append(result.job["id"])
    return job_ids


def start_lanes(cluster: CeleryCluster, **env) -> dict[str, object]:
    procs = {lane: cluster.worker(lane, wait=False, **env) for lane in LANES}
    for proc in procs.values():
        cluster.wait_ready(proc)
    return procs


def queue_is_drained(broker_url: str) -> bool:
    client = redis_lib.Redis.from_url(broker_url)
    try:
        return all(client.llen(q) == 0 for q in (*LANES, "maintenance")) and client.hlen("unacked") == 0
    finally:
        client.close()


# ------------------------------------------------------------------------------------ tests
def test_200_images_flow_end_to_end_through_all_three_queues(cluster, engine, publisher, call_log):
    counting(cluster)
    orch = make_orch(engine, cluster.settings)
    procs = start_lanes(cluster)
    job_ids = ingest_many(orch, cluster.settings, publisher, range(200))

    counts = wait_jobs_terminal(engine, job_ids, timeout=100)

    assert counts == {"succeeded": 200}
    assert_each_stage_once(call_log, 200)
    # each worker created only its own lane's provider, once, however many tasks it ran
    inits = collections.Counter((stage, pid) for stage, pid, _ in read_calls_by_pid(call_log) if stage.startswith("init-"))
    for lane, stage in (("visual", "init-visual"), ("agent", "init-agent"), ("embedding", "init-text")):
        pid = procs[lane].popen.pid
        assert {s: n for (s, p), n in inits.items() if p == pid} == {stage: 1}, (lane, inits)
    with engine.connect() as conn:
        lanes = dict(conn.execute(text("SELECT lane, count(*) FROM tasks WHERE status = 'succeeded' GROUP BY lane")).all())
    assert lanes == {"visual": 200, "agent": 200, "embedding": 200}


def test_dropped_and_duplicated_hints_still_finish_every_job_with_one_call_per_stage(
    cluster, engine, broker_url, call_log
):
    counting(cluster)
    orch = make_orch(engine, cluster.settings)
    faulty_env = {"MEMEFLOW_WORKER_PUBLISHER": "tests.integration.fakes:faulty_celery_publisher"}
    start_lanes(cluster, **faulty_env)
    cluster.worker("maintenance", **faulty_env)
    cluster.beat()
    inner, _app = make_publisher(broker_url)
    publisher = FaultyPublisher(inner, seed=7)

    job_ids = ingest_many(orch, cluster.settings, publisher, range(40))
    counts = wait_jobs_terminal(engine, job_ids, timeout=90)

    assert counts == {"succeeded": 40}
    assert_each_stage_once(call_log, 40)
    assert calls_by_stage(call_log)["hint-dropped"], "the fault injection dropped nothing"


def test_agent_worker_killed_inside_the_provider_call_never_calls_twice(cluster, engine, publisher, call_log, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    counting(cluster, agent_provider="tests.integration.fakes:BlockingAgent")
    cluster.extra_env["MEMEFLOW_TEST_GATE_DIR"] = str(gate)
    orch = make_orch(engine, cluster.settings)
    procs = start_lanes(cluster)

    with Sweeper(orch, publisher, cluster.settings.sweep_interval_s) as sweeper:
        [job_id] = ingest_many(orch, cluster.settings, publisher, [1])
        poll_until(lambda: (gate / "entered").exists(), timeout=30, what="agent inside the provider call")
        cluster.kill(procs["agent"], signal.SIGKILL)
        (gate / "release").write_text("go")  # a second call would not block: it would show in the log
        cluster.worker("agent")

        counts = wait_jobs_terminal(engine, [job_id], timeout=60)
    assert not sweeper.errors

    assert set(counts) <= {"succeeded", "unknown_execution"}, counts
    print(f"agent job after kill -9 and restart: {counts}")
    agent_calls = calls_by_stage(call_log)["agent"]
    assert sum(agent_calls.values()) == 1, agent_calls
    with engine.connect() as conn:
        states = conn.execute(text("SELECT state FROM task_attempts")).scalars().all()
    assert len(states) == 1 and states[0] in ("completed", "unknown_execution"), states


def test_visual_worker_killed_mid_task_reruns_after_lease_expiry(cluster, engine, publisher, call_log, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    counting(cluster, visual_provider="tests.integration.fakes:BlockingVisual")
    cluster.extra_env["MEMEFLOW_TEST_GATE_DIR"] = str(gate)
    orch = make_orch(engine, cluster.settings)
    procs = start_lanes(cluster)

    with Sweeper(orch, publisher, cluster.settings.sweep_interval_s):
        [job_id] = ingest_many(orch, cluster.settings, publisher, [2])
        poll_until(lambda: (gate / "entered-visual").exists(), timeout=30, what="visual inside the provider")
        killed_at = time.monotonic()
        cluster.kill(procs["visual"], signal.SIGKILL)
        cluster.worker("visual")
        counts = wait_jobs_terminal(engine, [job_id], timeout=60)

    assert counts == {"succeeded": 1}
    assert time.monotonic() - killed_at >= cluster.settings.lease_s * 0.5  # waited for the lease, roughly
    assert sum(calls_by_stage(call_log)["visual"].values()) == 2  # first run killed, one re-run
    with engine.connect() as conn:
        gen = conn.execute(text("SELECT claim_generation FROM tasks WHERE lane = 'visual'")).scalar_one()
    assert gen >= 2


def test_uploads_keep_flowing_while_redis_is_down_and_finish_after_it_returns(
    it_settings, engine, tmp_path, call_log
):
    own = EmbeddedServices(tmp_path / "own-redis")
    try:
        broker = own.start_redis()
        cluster = CeleryCluster(it_settings.replace(broker_url=broker, **COUNTING), broker, tmp_path,
                                extra_env={"MEMEFLOW_TEST_CALL_LOG": str(call_log)})
        try:
            orch = make_orch(engine, cluster.settings)
            publisher, _app = make_publisher(broker)
            start_lanes(cluster)
            with Sweeper(orch, publisher, cluster.settings.sweep_interval_s) as sweeper:
                before = ingest_many(orch, cluster.settings, publisher, range(100, 105))
                assert wait_jobs_terminal(engine, before, timeout=60) == {"succeeded": 5}

                own.stop_redis()
                during: list[uuid.UUID] = []
                outage_end = time.monotonic() + 20
                i = 200
                while time.monotonic() < outage_end:
                    t0 = time.monotonic()
                    during += ingest_many(orch, cluster.settings, publisher, [i])
                    assert time.monotonic() - t0 < 2.0, "an upload waited on the dead broker"
                    i += 1
                    time.sleep(0.25)  # pacing the uploads over the outage, not waiting for a result
                assert job_statuses(engine, during).get("queued", 0) + job_statuses(engine, during).get(
                    "running", 0) == len(during)

                own.start_redis()
                counts = wait_jobs_terminal(engine, during, timeout=90)
            assert counts == {"succeeded": len(during)}
            assert not sweeper.errors
            assert_each_stage_once(call_log, 5 + len(during))
        finally:
            cluster.stop_all()
    finally:
        own.stop_redis()


_SWEEP_LINE = re.compile(r"reconcile sweep (ran|skipped) start=([0-9.]+) end=([0-9.]+)")


def test_two_beats_never_overlap_sweeps_and_nothing_runs_twice(cluster, engine, broker_url, call_log):
    counting(cluster)
    orch = make_orch(engine, cluster.settings)
    faulty_env = {"MEMEFLOW_WORKER_PUBLISHER": "tests.integration.fakes:faulty_celery_publisher"}
    # the dedicated-maintenance topology: lane workers opt out (--no-maintenance), two sweepers
    start_lanes(cluster, MEMEFLOW_WORKER_MAINTENANCE="0", **faulty_env)
    sweepers = [cluster.worker("maintenance", name=f"maint{i}", wait=False) for i in range(2)]
    for proc in sweepers:
        cluster.wait_ready(proc)
    cluster.beat("beat-a")
    cluster.beat("beat-b")
    inner, _app = make_publisher(broker_url)

    job_ids = ingest_many(orch, cluster.settings, FaultyPublisher(inner, seed=11), range(30))
    assert wait_jobs_terminal(engine, job_ids, timeout=90) == {"succeeded": 30}

    def sweeps():
        out = []
        for proc in sweepers:
            out += [(proc.name, m[1], float(m[2]), float(m[3])) for m in _SWEEP_LINE.finditer(proc.log())]
        return out if sum(1 for s in out if s[1] == "ran") >= 6 else None

    records = poll_until(sweeps, timeout=30, interval=0.2, what="several sweeps")
    assert {who for who, *_ in records} == {"maint0", "maint1"}, "both maintenance workers must sweep"
    ran = sorted((start, end, who) for who, kind, start, end in records if kind == "ran")
    for (s1, e1, w1), (s2, e2, w2) in itertools.pairwise(ran):
        # a sweep that ran must have released the lock before the next one that ran took it: the
        # logged start/end are when each held the advisory lock (taken after the other's release;
        # 20 ms slack for the wall clock only)
        assert s2 >= e1 - 0.02, f"sweeps overlapped: {w1} [{s1}, {e1}] and {w2} [{s2}, {e2}]"
    assert_each_stage_once(call_log, 30)


def test_messages_for_finished_foreign_or_unknown_tasks_are_acked_and_change_nothing(
    cluster, engine, publisher, broker_url
):
    orch = make_orch(engine, cluster.settings)
    start_lanes(cluster)
    [job_id] = ingest_many(orch, cluster.settings, publisher, [3])
    assert wait_jobs_terminal(engine, [job_id], timeout=60) == {"succeeded": 1}
    # another scope's queued task whose real hint is lost (the broker db is flushed)
    other = ingest(orch, cluster.settings, 4, scope="other-scope", process=True)
    redis_lib.Redis.from_url(broker_url).flushdb()
    [other_hint] = other.hints

    def snapshot():
        with engine.connect() as conn:
            return sorted(map(tuple, conn.execute(text(
                "SELECT id, scope_id, status, claim_generation, attempt_count, lease_owner, updated_at FROM tasks"
            )).all()))

    before = snapshot()
    with engine.connect() as conn:
        finished = conn.execute(text("SELECT id, lane FROM tasks WHERE job_id = :j"), {"j": job_id}).all()
    _p, app = make_publisher(broker_url)
    from celeryconfig import LANE_TASKS

    for task_id, lane in finished:  # finished tasks
        app.send_task(LANE_TASKS[lane], args=[str(task_id)], queue=lane)
    for lane in LANES:  # unknown ids and garbage
        app.send_task(LANE_TASKS[lane], args=[str(uuid.uuid4())], queue=lane)
        app.send_task(LANE_TASKS[lane], args=["not-a-uuid"], queue=lane)
    # a message that tries to carry a scope: the signature admits an id only, so it is rejected
    app.send_task(LANE_TASKS["visual"], args=[str(other_hint.task_id)], kwargs={"scope_id": "local"}, queue="visual")
    app.send_task(LANE_TASKS["visual"], args=[str(other_hint.task_id), "local"], queue="visual")

    poll_until(lambda: queue_is_drained(broker_url), timeout=30, interval=0.1, what="messages acked")
    assert snapshot() == before
    assert job_statuses(engine, [job_id]) == {"succeeded": 1}
