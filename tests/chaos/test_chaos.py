"""The chaos test of SPEC §9 "Reliability", against real processes.

A dedicated embedded PostgreSQL + Redis (never the session's: this test restarts them), real
``celery worker`` processes in the SPEC §7 topology — 2 visual, 2 agent, 1 embedding and
``celery beat``, no dedicated maintenance worker (the lane workers run the sweeps) — with fast
intervals. While ~200 uploads flow through, the test SIGKILLs random workers (and beat)
and restarts them, every publisher drops and duplicates hints, Redis is stopped and started, and
PostgreSQL is restarted. Then, polling with a deadline, it proves:

* every job is terminal: ``succeeded``, or ``unknown_execution`` for an agent call whose outcome
  could not be proven (the recovery's lookup found no recorded result: the caller was killed, or
  frozen, before the provider recorded one); an adopted result was found by such a lookup;
* no duplicate paid agent call: at most one call per attempt id and per task, every call under a
  committed attempt, at most one ``completed`` attempt per task, and each image's context came
  from its task's one completed attempt;
* no fenced write accepted: every artifact row belongs to the succeeded task of its stage and
  image version, one per stage per image version, stages point at their succeeded task;
* nothing lost: one job per upload, no task left queued/running, every lane slot free.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from app.config import Settings
from app.db.engine import make_engine, upgrade_to_head
from app.embedded import EmbeddedServices
from tests.chaos.fakes import AGENT_LINGER_ENV, agent_calls, recorded
from tests.conftest import poll_until
from tests.integration.conftest import CeleryCluster, ingest, wait_jobs_terminal
from tests.integration.fakes import FaultyPublisher

pytestmark = pytest.mark.slow

N_IMAGES = 200
WAVES = 5  # uploads arrive in waves across the chaos, the last one after the PostgreSQL restart
WORKERS = {  # slot -> lanes; each slot always has one (possibly freshly restarted) process
    "visual-0": ("visual",), "visual-1": ("visual",), "agent-0": ("agent",), "agent-1": ("agent",),
    "embedding-0": ("embedding",),  # SPEC §7 building blocks only: the lane workers run the sweeps
}
FAULTY = {"MEMEFLOW_WORKER_PUBLISHER": "tests.integration.fakes:faulty_celery_publisher"}
PROVIDERS = {
    "visual_provider": "tests.integration.fakes:CountingVisual",
    "agent_provider": "tests.chaos.fakes:AttemptRecordingAgent",
    "text_provider": "tests.integration.fakes:CountingText",
}


@pytest.fixture()
def chaos_root():
    # Under /tmp and world-traversable: the embedded server runs as an unprivileged user.
    # CHAOS_KEEP=1 keeps it (process logs, call log, data directory) for a post-mortem.
    root = Path(tempfile.mkdtemp(prefix="memeflow-chaos-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    if not os.environ.get("CHAOS_KEEP"):
        shutil.rmtree(root, ignore_errors=True)
    else:
        print("kept", root)


@pytest.fixture()
def own_services(chaos_root):
    """PostgreSQL and Redis of this test alone: restarting them disturbs no other test."""
    svc = EmbeddedServices(chaos_root / "services", fast_unsafe=True)
    try:
        urls = svc.start()
        upgrade_to_head(urls.database_url)
        yield svc, urls
    finally:
        svc.stop()


@pytest.fixture()
def chaos_cluster(own_services, chaos_root):
    _svc, urls = own_services
    settings = Settings(
        database_url=urls.database_url, broker_url=urls.broker_url, var_dir=chaos_root / "app",
        lease_s=2.0, heartbeat_s=0.5, sweep_interval_s=0.5, rehint_grace_s=0.5,
        backoff_base_s=0.05, backoff_max_s=0.5, embedding_batch_size=8, log_json=True, **PROVIDERS,
    )
    logs = chaos_root / "logs"
    logs.mkdir()
    cluster = CeleryCluster(settings, urls.broker_url, logs, extra_env={
        "MEMEFLOW_TEST_CALL_LOG": str(chaos_root / "calls.log"), AGENT_LINGER_ENV: "0.1",
    })
    yield cluster
    cluster.stop_all()


def _rows(engine, sql: str, **params) -> list:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).mappings().all()


def _scalar(engine, sql: str):
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def test_chaos_kills_restarts_and_lost_hints_lose_nothing_and_repeat_no_paid_call(
    own_services, chaos_cluster, chaos_root
):
    svc, urls = own_services
    cluster = chaos_cluster
    settings = cluster.settings
    call_log = chaos_root / "calls.log"
    rng = random.Random(20250611)
    engine = make_engine(urls.database_url, pool_size=4, max_overflow=4)
    from app.orchestrator import Orchestrator
    from app.publisher import CeleryHintPublisher, celery_app_for

    orch = Orchestrator(engine, settings)
    client = celery_app_for(urls.broker_url, "memeflow-chaos-uploads")
    # a long cooldown: uploads during the Redis outage pay one failed connect, not one each
    uploads_publisher = FaultyPublisher(CeleryHintPublisher(client, cooldown_s=3.0), seed=5)

    generation = collections.Counter()

    def start(slot: str, wait: bool = False):
        generation[slot] += 1
        return cluster.worker(*WORKERS[slot], name=f"{slot}-g{generation[slot]}", wait=wait, **FAULTY)

    procs = {slot: start(slot) for slot in WORKERS}
    for proc in procs.values():
        cluster.wait_ready(proc)
    beat = cluster.beat("beat-g1")
    figures = collections.Counter()
    thaws: list[threading.Timer] = []
    frozen: set[int] = set()

    job_ids: list[uuid.UUID] = []
    per_wave = N_IMAGES // WAVES
    waves = iter(range(WAVES))

    def upload_wave() -> None:
        wave = next(waves)
        for i in range(wave * per_wave, (wave + 1) * per_wave):
            result = ingest(orch, settings, i)
            uploads_publisher.publish(result.hints)
            job_ids.append(result.job["id"])

    def kill_random_worker() -> None:
        # agent workers twice as likely: a kill inside the paid call is the case that matters most
        # (a frozen worker is left alone: its late writes after the thaw are what fencing is for)
        slot = rng.choice([s for s in (*WORKERS, "agent-0", "agent-1") if procs[s].popen.pid not in frozen])
        cluster.kill(procs[slot], signal.SIGKILL)
        figures["worker_kills"] += 1
        procs[slot] = start(slot)
        figures["worker_restarts"] += 1

    def kill_beat() -> None:
        nonlocal beat
        cluster.kill(beat, signal.SIGKILL)
        beat = cluster.beat("beat-g2")
        figures["beat_kills"] += 1

    def lease_holders() -> set[int]:
        rows = _rows(engine, "SELECT lease_owner FROM tasks WHERE status = 'running' AND lane IN ('agent', 'visual')")
        return {int(r["lease_owner"].split(":")[1]) for r in rows}  # owner = host:pid:random

    def freeze_busy_worker() -> None:
        # SIGSTOP a worker while it holds a lease, for longer than the lease: another worker
        # reclaims the task (generation bump) and the frozen one's late writes must be fenced out.
        for _try in range(20):
            holders = lease_holders()
            busy = [p for p in procs.values() if p.popen.pid in holders and p.alive]
            if not busy:
                continue
            pid = rng.choice(busy).popen.pid
            os.kill(pid, signal.SIGSTOP)
            if pid in lease_holders():
                break
            os.kill(pid, signal.SIGCONT)  # it finished its task just before the stop: try again
        else:
            return
        figures["worker_freezes"] += 1
        frozen.add(pid)

        def thaw() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            frozen.discard(pid)

        timer = threading.Timer(2.5 * settings.lease_s, thaw)
        timer.start()
        thaws.append(timer)

    def stop_redis() -> None:
        svc.stop_redis()
        figures["redis_restarts"] += 1

    def restart_postgres() -> None:
        svc.restart_postgres()
        figures["postgres_restarts"] += 1

    # The timeline paces the faults; it never waits for a result (that is the deadline poll below).
    # Freezes sit outside the Redis outage, so the frozen worker's task is reclaimed meanwhile.
    timeline = sorted(
        [(t, upload_wave) for t in (0.0, 3.0, 6.0, 10.0, 18.0)]
        + [(1.0 + 1.6 * k, kill_random_worker) for k in range(14)]
        + [(t, freeze_busy_worker) for t in (1.4, 10.4, 18.4)]
        + [(6.5, stop_redis), (8.5, svc.start_redis), (12.0, kill_beat), (15.5, restart_postgres)],
        key=lambda event: event[0],
    )
    t0 = time.monotonic()
    for due, action in timeline:
        time.sleep(max(0.0, t0 + due - time.monotonic()))
        action()
    chaos_s = time.monotonic() - t0

    for timer in thaws:
        timer.join()
    counts = wait_jobs_terminal(engine, job_ids, timeout=150)
    settled_s = time.monotonic() - t0

    def nothing_in_flight():
        busy = _scalar(engine, "SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')")
        held = _scalar(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL")
        return busy == 0 and held == 0

    poll_until(nothing_in_flight, timeout=30, interval=0.2, what="no task in flight and every lane slot free")
    for proc in procs.values():  # every restarted worker came up (and stayed up through both restarts)
        cluster.wait_ready(proc)
    assert beat.alive, beat.log()[-2000:]

    figures["fencing_rejections"] = _scalar(
        engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'")
    figures["rehints"] = _scalar(engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'rehint'")
    figures["hints_dropped"] = len(recorded(call_log, "hint-dropped"))
    figures["recovery_lookups"] = len(recorded(call_log, "lookup"))

    # ---- the sweeps ran in the lane workers (no process consumes only `maintenance`)
    assert not any(lanes == ("maintenance",) for lanes in WORKERS.values())
    assert _scalar(engine, "SELECT count(*) FROM sweep_state") == 1, "no sweep ever completed"
    figures["lane_worker_sweeps"] = sum(p.log().count("reconcile sweep ran") for p in cluster.procs)

    # ---- every job terminal; nothing lost
    assert len(job_ids) == N_IMAGES
    assert set(counts) <= {"succeeded", "unknown_execution"}, counts
    assert _scalar(engine, "SELECT count(*) FROM images") == N_IMAGES
    per_image = _rows(engine, "SELECT i.id, count(j.id) AS n FROM images i LEFT JOIN processing_jobs j"
                              " ON j.image_id = i.id GROUP BY i.id")
    assert all(r["n"] == 1 for r in per_image), "every upload has exactly one job"

    # ---- no duplicate paid agent call
    calls = list(agent_calls(call_log))
    attempts = _rows(engine, "SELECT attempt_id, task_id, claim_generation, state FROM task_attempts")
    by_attempt = {a["attempt_id"]: a for a in attempts}
    calls_per_attempt = collections.Counter(attempt_id for _pid, attempt_id, _key in calls)
    assert max(calls_per_attempt.values()) == 1, "a provider call was repeated under one attempt id"
    assert set(calls_per_attempt) <= set(by_attempt), "a paid call ran without a committed attempt"
    calls_per_task = collections.Counter(by_attempt[a]["task_id"] for a in calls_per_attempt)
    assert max(calls_per_task.values()) == 1, "a paid call was repeated for one task"
    lookups = collections.defaultdict(list)
    for key in recorded(call_log, "lookup"):
        attempt_id, status = key.split(" ")
        lookups[attempt_id].append(status)
    completed = collections.defaultdict(list)
    for a in attempts:
        assert a["state"] in ("completed", "unknown_execution"), a  # nothing left open
        if a["state"] == "completed":
            completed[a["task_id"]].append(a)
    assert all(len(v) == 1 for v in completed.values()), "two completed attempts for one task"

    agent_tasks = _rows(engine, "SELECT t.id, t.status, t.claim_generation, t.result, t.job_id,"
                                " i.context_provenance AS prov FROM tasks t JOIN images i ON i.id = t.image_id"
                                " WHERE t.lane = 'agent'")
    job_status = {r["id"]: r["status"] for r in _rows(engine, "SELECT id, status FROM processing_jobs")}
    for t in agent_tasks:
        if t["status"] == "succeeded":
            [attempt] = completed[t["id"]]
            assert calls_per_attempt[attempt["attempt_id"]] == 1, "the adopted result came from no call"
            assert t["result"]["attempt_id"] == attempt["attempt_id"]
            assert t["prov"]["attempt_id"] == attempt["attempt_id"] and t["prov"]["task_id"] == str(t["id"])
            if attempt["claim_generation"] < t["claim_generation"]:  # adopted by a later claim
                assert "complete" in lookups[attempt["attempt_id"]], lookups[attempt["attempt_id"]]
                figures["agent_adopted"] += 1
        else:
            assert t["status"] == "failed" and job_status[t["job_id"]] == "unknown_execution", t
            assert not completed[t["id"]]
            [attempt] = [a for a in attempts if a["task_id"] == t["id"]]
            # honest: the recovery's lookup found no result (a frozen caller may record one later)
            assert "complete" not in lookups[attempt["attempt_id"]], (attempt, lookups[attempt["attempt_id"]])
            figures["unknown_after_a_call"] += attempt["attempt_id"] in calls_per_attempt
    figures["unknown_execution"] = counts.get("unknown_execution", 0)
    figures["agent_calls"] = len(calls)

    # ---- no fenced write accepted: every artifact is its stage's succeeded task's, one per image version
    succeeded_task = {(r["image_id"], r["lane"]): r["id"] for r in _rows(
        engine, "SELECT image_id, lane, id FROM tasks WHERE status = 'succeeded'")}
    assert len(succeeded_task) == len(_rows(engine, "SELECT id FROM tasks WHERE status = 'succeeded'")), \
        "two succeeded tasks for one stage of one image"
    for table, lane in (("visual_embeddings", "visual"), ("text_embeddings", "embedding")):
        rows = _rows(engine, f"SELECT a.image_id, a.task_id, a.image_sha256 = i.sha256 AS same_sha FROM {table} a"
                             " JOIN images i ON i.id = a.image_id")
        assert len({r["image_id"] for r in rows}) == len(rows), f"{table}: two rows for one image version"
        assert all(r["same_sha"] for r in rows), table
        assert all(succeeded_task.get((r["image_id"], lane)) == r["task_id"] for r in rows), \
            f"{table}: a row written by a task that is not the stage's succeeded task"
        assert len(rows) == sum(1 for (_i, ln) in succeeded_task if ln == lane)
    stale_text = _scalar(engine, "SELECT count(*) FROM text_embeddings te JOIN images i ON i.id = te.image_id"
                                 " WHERE te.metadata_hash IS DISTINCT FROM i.metadata_hash")
    assert stale_text == 0
    bad_stages = _rows(engine, "SELECT js.job_id, js.stage, js.status FROM job_stages js"
                               " JOIN processing_jobs j ON j.id = js.job_id"
                               " LEFT JOIN tasks t ON t.id = js.task_id"
                               " WHERE j.status = 'succeeded' AND (js.status NOT IN ('succeeded', 'reused')"
                               "  OR (js.status = 'succeeded' AND t.status IS DISTINCT FROM 'succeeded'))")
    assert not bad_stages, bad_stages

    print(f"\nchaos: {N_IMAGES} images, jobs {dict(counts)}, chaos {chaos_s:.1f}s, settled {settled_s:.1f}s; "
          + ", ".join(f"{k}={v}" for k, v in sorted(figures.items())))
    assert figures["hints_dropped"] > 0 and figures["worker_kills"] >= 10
