"""The SPEC §7 building blocks alone — lane workers and beat, no dedicated maintenance worker —
recover a killed worker's task (SPEC §10 "Sweep"), and every worker's liveness is visible in the
database registry, in ``memeflow status`` and on ``/readyz`` (real processes, deadline polls)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from sqlalchemy import text

from app.orchestrator.liveness import read_liveness
from tests.conftest import poll_until
from tests.integration.conftest import ROOT, ingest, wait_jobs_terminal

pytestmark = pytest.mark.slow

COUNTING = {
    "visual_provider": "tests.integration.fakes:BlockingVisual",
    "agent_provider": "tests.integration.fakes:CountingAgent",
    "text_provider": "tests.integration.fakes:CountingText",
}
REGISTRY_INTERVAL_S = 0.5


def _registry(engine) -> dict[str, dict]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT node, pid, lanes FROM worker_registry")).mappings().all()
    return {r["node"].split("@")[0]: dict(r) for r in rows}


def _sweeps_ran(proc) -> int:
    return proc.log().count("reconcile sweep ran")


def _liveness_reaches(engine, settings, workers: dict[str, int], what: str, fresh_sweep: bool = False):
    """Poll ``read_liveness`` until it counts ``workers`` per lane (and, with ``fresh_sweep``, a sweep
    that is not stale and no reasons). One read is a snapshot of heartbeats a loaded box may have
    delayed past the registry TTL (3 x 0.5 s) or the sweep's staleness bound (3 x 0.5 s); the
    workers beat on, so a live deployment gets there within the deadline and a dead one never does."""
    last = []

    def reached():
        live = read_liveness(engine, settings)
        last[:] = [live]
        counts = {lane: v.workers for lane, v in live.lanes.items()}
        return live if counts == workers and not (fresh_sweep and (live.sweep_stale or live.reasons)) else None

    try:
        return poll_until(reached, timeout=30, interval=0.1, what=what)
    except AssertionError as exc:
        live = last[0]
        raise AssertionError(f"{exc}: workers {({k: v.workers for k, v in live.lanes.items()})}, "
                             f"sweep age {live.sweep_age_s}, reasons {live.reasons}") from None


def test_lane_workers_and_beat_alone_recover_a_killed_workers_task_and_show_their_liveness(
    cluster, engine, publisher, call_log, tmp_path
):
    gate = tmp_path / "gate"
    gate.mkdir()
    cluster.settings = cluster.settings.replace(**COUNTING, worker_registry_interval_s=REGISTRY_INTERVAL_S)
    cluster.extra_env.update(MEMEFLOW_TEST_GATE_DIR=str(gate),
                             MEMEFLOW_WORKER_REGISTRY_INTERVAL_S=str(REGISTRY_INTERVAL_S))
    from app.orchestrator import Orchestrator

    orch = Orchestrator(engine, cluster.settings)
    names = ("visual-a", "visual-b", "agent", "embedding")  # SPEC §7: no `--lane maintenance` anywhere
    procs = {name: cluster.worker(name.split("-")[0], name=name, wait=False) for name in names}
    for proc in procs.values():
        cluster.wait_ready(proc)
    beat = cluster.beat()

    # every worker registers itself, serving its lane and the maintenance queue
    def all_registered():
        rows = _registry(engine)
        return rows if set(rows) == set(names) else None

    registry = poll_until(all_registered, timeout=30, interval=0.1, what="four registered workers")
    for name, row in registry.items():
        assert row["lanes"] == sorted([name.split("-")[0], "maintenance"]), row
        assert row["pid"] == procs[name].popen.pid
    _liveness_reaches(engine, cluster.settings, {"visual": 2, "agent": 1, "embedding": 1, "webhooks": 0,
                                                 "maintenance": 4}, "four live workers")

    # a visual worker is SIGKILLed inside the provider call; nobody restarts it
    result = ingest(orch, cluster.settings, 7)
    publisher.publish(result.hints)
    poll_until(lambda: (gate / "entered-visual").exists(), timeout=30, what="visual inside the provider")
    holder_pid = int((gate / "entered-visual").read_text())
    [killed] = [name for name, proc in procs.items() if proc.popen.pid == holder_pid]
    cluster.kill(procs[killed], signal.SIGKILL)

    # the lease expires, a sweep run by a lane worker re-hints, the surviving visual worker finishes
    assert wait_jobs_terminal(engine, [result.job["id"]], timeout=90) == {"succeeded": 1}
    assert beat.alive, beat.log()[-2000:]
    survivors = [p for name, p in procs.items() if name != killed]
    assert sum(_sweeps_ran(p) for p in survivors) > 0, "no lane worker ran a sweep"
    with engine.connect() as conn:
        generation = conn.execute(text("SELECT claim_generation FROM tasks WHERE lane = 'visual'")).scalar_one()
    assert generation >= 2  # the killed execution's claim was superseded, not finished

    # the killed worker's registration expires and a sweep prunes it; the sweep's time is recorded
    poll_until(lambda: killed not in _registry(engine), timeout=30, interval=0.1, what="the dead worker pruned")
    _liveness_reaches(engine, cluster.settings, {"visual": 1, "agent": 1, "embedding": 1, "webhooks": 0,
                                                 "maintenance": 3}, "three live workers and a fresh sweep",
                      fresh_sweep=True)

    # a clean shutdown removes its row at once; `memeflow status` shows workers and the sweep
    procs["embedding"].popen.send_signal(signal.SIGTERM)
    procs["embedding"].popen.wait(timeout=30)
    assert "embedding" not in _registry(engine)
    out = subprocess.run([sys.executable, "-m", "app.cli", "status"], env=cluster.env(COLUMNS="200"), cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "workers" in out.stdout and "last sweep:" in out.stdout, out.stdout
    lines = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 6}
    assert lines["visual"].rstrip(" │").endswith("1") and lines["maintenance"].rstrip(" │").endswith("2"), out.stdout


def test_a_sweep_never_waits_inside_a_busy_worker(cluster, engine, publisher, tmp_path):
    """Prefetch 1 with late acks: a worker busy in a long provider call has reserved no sweep
    message, so the sweep goes to the next free worker instead of waiting behind the batch. The
    busy worker runs the prefork pool, whose main process keeps consuming while its child works
    (a solo worker cannot consume while busy at all): it must still reserve nothing."""
    import celeryconfig
    from app.publisher import celery_app_for

    gate = tmp_path / "gate"
    gate.mkdir()
    cluster.settings = cluster.settings.replace(**COUNTING)
    cluster.extra_env["MEMEFLOW_TEST_GATE_DIR"] = str(gate)
    from app.orchestrator import Orchestrator

    orch = Orchestrator(engine, cluster.settings)
    busy = cluster.worker("visual", name="busy-visual", pool="prefork")
    result = ingest(orch, cluster.settings, 11)
    publisher.publish(result.hints)
    poll_until(lambda: (gate / "entered-visual").exists(), timeout=30, what="visual parked inside the provider")
    client = celery_app_for(cluster.broker_url, "memeflow-test-sweeps")
    try:
        for _ in range(3):  # more than the busy worker could ever hold
            client.send_task(celeryconfig.SWEEP_TASK, queue=celeryconfig.MAINTENANCE,
                             routing_key=celeryconfig.MAINTENANCE)
        idle = cluster.worker("embedding", name="idle-embedding")
        poll_until(lambda: idle.log().count("reconcile sweep ") >= 3, timeout=60, interval=0.1,
                   what="the idle worker ran all three sweeps")
    finally:
        (gate / "release-visual").write_text("go")
        client.close()
    assert "reconcile sweep" not in busy.log()
