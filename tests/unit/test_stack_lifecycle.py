"""`memeflow up`'s supervisor around its own life: the agent worker's stop grace, closing the
terminal (SIGHUP), a supervisor that dies (its children die with it), and services it did not
start that stop under it. Real processes where the behaviour is about processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from app.cli.stack import Stack, StackError
from app.config import COMPLETION_DRAIN_S, Settings
from app.embedded import ServiceUrls, _pid_alive
from tests.conftest import poll_until

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


# ---------------------------------------------------------------------------------------- F3
def test_the_agent_worker_may_finish_a_call_in_flight_and_commit_it_before_it_is_killed(tmp_path):
    settings = Settings(var_dir=tmp_path, agent_timeout_s=60.0)
    stack = Stack(settings, components=("agent", "visual", "embedding", "webhooks", "beat"), stop_timeout_s=15)
    graces = {c.name: c.stop_grace_s for c in stack._plan()}
    assert graces["agent"] >= settings.agent_timeout_s + COMPLETION_DRAIN_S
    assert graces["visual"] is graces["embedding"] is graces["webhooks"] is graces["beat"] is None  # 15 s
    slow = Stack(Settings(var_dir=tmp_path, agent_timeout_s=300.0), components=("agent",))
    assert slow._plan()[0].stop_grace_s >= 300.0 + COMPLETION_DRAIN_S


def test_the_agent_stop_grace_covers_the_whole_call_deadline_not_only_the_read_timeout(tmp_path):
    """An openai-compatible call may run MEMEFLOW_AGENT_DEADLINE_S (120 s by default: connect,
    request, headers, a slowly streamed body), longer than MEMEFLOW_AGENT_TIMEOUT_S (60 s, each
    read). A grace from the timeout alone (100 s) killed a paid call still within its deadline, and
    its job ended unknown_execution."""
    from app.cli.stack import agent_stop_grace_s

    settings = Settings(var_dir=tmp_path, agent_provider="openai-compatible")
    assert settings.agent_deadline_s > settings.agent_timeout_s  # the defaults: 120 vs 60
    assert agent_stop_grace_s(settings) >= settings.agent_deadline_s + COMPLETION_DRAIN_S
    plan = Stack(settings, components=("agent",))._plan()
    assert plan[0].stop_grace_s >= settings.agent_deadline_s + COMPLETION_DRAIN_S
    # deadline 0 = the read timeout plus the connect timeout (the provider's rule)
    unset = Settings(var_dir=tmp_path, agent_timeout_s=200.0, agent_deadline_s=0.0)
    assert agent_stop_grace_s(unset) > 200.0 + COMPLETION_DRAIN_S


def test_stop_waits_out_a_long_grace_while_killing_the_others_at_the_stop_timeout(tmp_path):
    from app.cli.children import Child

    stack = Stack(Settings(var_dir=tmp_path), components=("beat",), stop_timeout_s=0.3, echo=lambda *a, **k: None)
    # "agent" finishes its call 1.5 s after SIGTERM and exits 0; "stubborn" ignores SIGTERM
    finishing = Child("agent", _python("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.5), sys.exit(0)))
        print("ready", flush=True); time.sleep(600)"""), _env(), tmp_path / "agent.log", stop_grace_s=30.0)
    stubborn = Child("stubborn", _python("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True); time.sleep(600)"""), _env(), tmp_path / "stubborn.log")
    stack.children = [finishing, stubborn]
    for child in stack.children:
        child.spawn()
    try:
        poll_until(lambda: all(b"ready" in c.log_path.read_bytes() for c in stack.children), timeout=20,
                   what="both children ready")
        procs = [c.proc for c in stack.children]
        stack.stop()
        assert procs[0].returncode == 0  # finished, not killed
        assert procs[1].returncode == -signal.SIGKILL
    finally:
        for child in (finishing, stubborn):
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()


# ---------------------------------------------------------------------------------------- F1
def test_sighup_stops_the_supervisor_like_ctrl_c():
    proc = subprocess.Popen(_python("""
        import threading
        from app.cli.stack import stop_on_signals
        stop = threading.Event()
        stop_on_signals(stop)
        print("ready", flush=True)
        print("stopping" if stop.wait(60) else "timed out", flush=True)"""),
        env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out.strip() == "stopping"  # an orderly stop, not killed by SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_supervisor_killed_with_sigkill(tmp_path):
    supervisor = subprocess.Popen(_python(f"""
        import sys, time
        from pathlib import Path
        from app.cli.children import Child
        child = Child("worker", [sys.executable, "-c", "import time; time.sleep(600)"], {{}},
                      Path({str(tmp_path / "worker.log")!r}))
        child.spawn()
        print(child.proc.pid, flush=True)
        time.sleep(600)"""), env=_env(), stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        child_pid = int(supervisor.stdout.readline())
        assert _pid_alive(child_pid)
        supervisor.kill()
        supervisor.wait()
        poll_until(lambda: not _pid_alive(child_pid), timeout=20, interval=0.05,
                   what="the orphaned child to get its death signal")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        supervisor.stdout.close()
        if child_pid and _pid_alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------- F2
class _FakeServices:
    """Embedded services another stack started: running at first, then stopped under us."""

    def __init__(self, var_dir: Path):
        self.var_dir = var_dir
        self.running = True
        self.stopped_by_us = False

    def urls(self):
        return ServiceUrls("postgresql+psycopg2://x", "redis://127.0.0.1:1/0") if self.running else None

    def start(self):
        return self.urls()

    def stop(self):
        self.stopped_by_us = True


def test_supervise_fails_when_services_it_found_running_stop(tmp_path, monkeypatch):
    fake = _FakeServices(tmp_path)
    monkeypatch.setattr("app.runtime.embedded_services", lambda settings: fake)
    stack = Stack(Settings(var_dir=tmp_path), components=("beat",), echo=lambda *a, **k: None)
    stack._start_services()  # found running: not this stack's to stop
    stop = threading.Event()
    guard = threading.Timer(20, stop.set)  # without the check, supervise would run until the guard
    guard.start()
    try:
        fake.running = False  # the other stack stopped them
        with pytest.raises(StackError, match="stopped"):
            stack.supervise(stop)
    finally:
        guard.cancel()
        stack.stop()
    assert not fake.stopped_by_us


def test_supervise_says_a_worker_the_watchdog_ended_ran_past_its_maximum_and_restarts_it(tmp_path):
    from app.cli.children import Child
    from app.config import STAGE_TIMEOUT_EXIT

    said: list[str] = []
    stop = threading.Event()

    def echo(message, **_):
        said.append(message)
        if "restarting" in message:
            stop.set()

    stack = Stack(Settings(var_dir=tmp_path), components=(), echo=echo)
    child = Child("agent", _python(f"import os; os._exit({STAGE_TIMEOUT_EXIT})"), _env(), tmp_path / "agent.log")
    child.spawn()
    child.proc.wait(timeout=30)
    stack.children = [child]
    guard = threading.Timer(20, stop.set)
    guard.start()
    try:
        stack.supervise(stop)
    finally:
        guard.cancel()
        stack.stop()
    [line] = [m for m in said if "restarting" in m]
    assert f"exited ({STAGE_TIMEOUT_EXIT}" in line and "RUN_MAX_S" in line
