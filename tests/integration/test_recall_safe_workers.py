"""Real Celery agent workers killed mid-call (SPEC §4.5, docs/architecture.md "Recall-safe agents"):

- a local, recall-safe agent (as ``local-ocr``) SIGKILLed inside its call: the job still ends
  ``succeeded`` with no human action — the interrupted attempt recorded ``failed`` (``worker_died``),
  the call run again by the restarted worker;
- a local agent that kills its worker on one image every time (``os._exit``, as a segfault or an
  OOM kill would), in a threads-pool worker that runs it beside others: the image ends ``failed``
  (``max_attempts_exceeded``) after its own deaths, no crash loop, and the other images succeed
  uncharged;
- a paid ``openai-compatible`` agent, against a real local HTTP server, killed while its request is
  in flight: unchanged — ``unknown_execution``, the request never sent twice.
Workers are restarted after each death, as their supervisor would."""

from __future__ import annotations

import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.conftest import poll_until
from tests.integration.conftest import Sweeper, wait_jobs_terminal
from tests.integration.test_celery_runtime import calls_by_stage, ingest_many, start_lanes
from tests.support import poison
from tests.support.pipeline import png_bytes, store_and_ingest

pytestmark = pytest.mark.slow


def _attempts(engine):
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT state, error->>'code', recall_safe FROM task_attempts ORDER BY task_id, attempt_no")).all()]


def test_a_local_agent_worker_killed_mid_call_ends_the_job_succeeded_without_a_human(
        cluster, engine, publisher, call_log, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    cluster.settings = cluster.settings.replace(agent_provider="tests.integration.fakes:ParkingLocalAgent")
    cluster.extra_env["MEMEFLOW_TEST_GATE_DIR"] = str(gate)
    orch = Orchestrator(engine, cluster.settings)
    procs = start_lanes(cluster)

    with Sweeper(orch, publisher, cluster.settings.sweep_interval_s) as sweeper:
        [job_id] = ingest_many(orch, cluster.settings, publisher, [1])
        poll_until(lambda: (gate / "entered").exists(), timeout=30, what="agent inside its call")
        cluster.kill(procs["agent"], signal.SIGKILL)
        cluster.worker("agent")  # its supervisor restarts it; nobody retries anything by hand
        counts = wait_jobs_terminal(engine, [job_id], timeout=60)
    assert not sweeper.errors

    assert counts == {"succeeded": 1}
    agent_calls = calls_by_stage(call_log)["agent"]
    assert list(agent_calls.values()) == [2]  # the killed call, and the one run again
    assert _attempts(engine) == [("failed", "worker_died", True), ("completed", None, True)]
    with engine.connect() as c:
        assert c.execute(text("SELECT state FROM operation_grants")).scalars().all() == ["committed"]


MAX_ATTEMPTS = 2


def test_a_worker_killing_image_ends_failed_after_max_attempts_and_its_neighbours_succeed(
        cluster, engine, publisher, call_log):
    settings = cluster.settings.replace(agent_provider="tests.support.poison:ExitAgent", max_attempts=MAX_ATTEMPTS)
    cluster.settings = settings
    cluster.extra_env["MEMEFLOW_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)  # the visual worker creates the agent tasks
    orch = Orchestrator(engine, settings)
    cluster.worker("visual")
    cluster.worker("embedding")
    job_ids = [store_and_ingest(orch, "local", data) for data in
               (png_bytes(1, (poison.POISON_WIDTH, 40)), png_bytes(2), png_bytes(3))]
    for res in job_ids:
        publisher.publish(res.hints)

    def agent_worker():  # a local agent's worker: calls side by side in threads
        return cluster.worker("agent", wait=False, pool="threads", concurrency=2, prefetch=2)

    workers = [agent_worker()]

    def terminal():
        if not workers[-1].alive:  # died: its supervisor starts another
            workers.append(agent_worker())
        with engine.connect() as c:
            statuses = c.execute(text("SELECT status FROM processing_jobs WHERE status IN ('queued', 'running')")).all()
        return not statuses

    with Sweeper(orch, publisher, interval=0.3) as sweeper:
        poll_until(terminal, timeout=150, interval=0.2, what="every job terminal")
    assert sweeper.errors == []

    with engine.connect() as c:
        tasks = c.execute(text(
            "SELECT i.width, t.status, t.attempt_count, t.error->>'code' AS code, j.status AS job FROM tasks t"
            " JOIN images i ON i.id = t.image_id JOIN processing_jobs j ON j.id = t.job_id"
            " WHERE t.lane = 'agent' ORDER BY i.width")).mappings().all()
    bad = [dict(t) for t in tasks if t["width"] == poison.POISON_WIDTH]
    good = [dict(t) for t in tasks if t["width"] != poison.POISON_WIDTH]
    # MAX_ATTEMPTS + 1: after its last death one recovery claim looked the attempt up (no call)
    assert bad == [{"width": poison.POISON_WIDTH, "status": "failed", "attempt_count": MAX_ATTEMPTS + 1,
                    "code": "max_attempts_exceeded", "job": "failed"}]
    assert [(g["status"], g["attempt_count"], g["job"]) for g in good] == [("succeeded", 1, "succeeded")] * 2
    # the first death ran beside another call (charged to none); then MAX_ATTEMPTS deaths of its own, alone
    deaths = [sizes for lane, sizes, ok in poison.read_call_log(call_log) if lane == "agent" and not ok]
    assert len(deaths) == MAX_ATTEMPTS + 1
    dead = [w for w in workers if not w.alive]
    assert [w.popen.returncode for w in dead] == [70] * (MAX_ATTEMPTS + 1)
    with engine.connect() as c:
        open_or_unknown = c.execute(text(
            "SELECT count(*) FROM task_attempts WHERE state IN ('external_started', 'unknown_execution')")).scalar_one()
    assert open_or_unknown == 0  # every attempt says what happened


class _ParkingChatServer:
    """A local OpenAI-compatible server whose chat completions park until released (the paid call
    in flight when its worker dies); counts the requests it received."""

    def __init__(self) -> None:
        self.posts = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts += 1
                outer.entered.set()
                outer.release.wait(60)
                self.send_response(500)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_paid_agent_worker_killed_mid_call_still_ends_unknown_execution(cluster, engine, publisher):
    server = _ParkingChatServer()
    try:
        cluster.settings = cluster.settings.replace(agent_provider="openai-compatible", agent_base_url=server.url,
                                                    agent_model="stub-model", agent_api_key="stub-key")
        cluster.extra_env.update(MEMEFLOW_AGENT_BASE_URL=server.url, MEMEFLOW_AGENT_MODEL="stub-model",
                                 MEMEFLOW_AGENT_API_KEY="stub-key")
        orch = Orchestrator(engine, cluster.settings)
        procs = start_lanes(cluster)
        with Sweeper(orch, publisher, cluster.settings.sweep_interval_s) as sweeper:
            [job_id] = ingest_many(orch, cluster.settings, publisher, [1])
            poll_until(server.entered.is_set, timeout=30, what="the paid request in flight")
            cluster.kill(procs["agent"], signal.SIGKILL)
            cluster.worker("agent")
            counts = wait_jobs_terminal(engine, [job_id], timeout=60)
        assert not sweeper.errors
        assert counts == {"unknown_execution": 1}
        assert server.posts == 1  # never sent twice
        assert _attempts(engine) == [("unknown_execution", "unknown_execution", False)]
    finally:
        server.close()
