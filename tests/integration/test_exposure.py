"""Network exposure of real processes (issue 17 §2): ``memeflow api``, gunicorn and ``memeflow up``
refuse to serve ``MEMEFLOW_AUTH=none`` beyond loopback; the API's gunicorn keeps serving while slow
clients hold connections; Flower's credentials never reach a command line."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from app.cli.processes import api_cmd
from app.cli.stack import Stack
from app.netguard import UnsafeBind
from tests.conftest import poll_until
from tests.integration.conftest import ROOT

PYTHON = sys.executable
MEMEFLOW = [PYTHON, "-m", "app.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.3):
        return True
    return False


@pytest.fixture()
def env(settings, broker_url, tmp_path) -> dict[str, str]:
    e = dict(os.environ)
    for key in [k for k in e if k.startswith(("MEMEFLOW_", "FLOWER_"))]:
        del e[key]
    e.update(MEMEFLOW_DATABASE_URL=str(settings.database_url), MEMEFLOW_BROKER_URL=broker_url,
             MEMEFLOW_VAR_DIR=str(tmp_path / "var"), MEMEFLOW_AUTH="none", MEMEFLOW_LOG_JSON="0",
             MEMEFLOW_VISUAL_PROVIDER="deterministic", MEMEFLOW_AGENT_PROVIDER="deterministic",
             MEMEFLOW_TEXT_PROVIDER="deterministic", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return e


@pytest.fixture()
def spawn(tmp_path):
    """Start a process in its own session; every one is killed (by its group id) at teardown."""
    started: list[subprocess.Popen] = []

    def start(cmd: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=tmp_path)
        proc.log_path = tmp_path / f"{name}.log"  # type: ignore[attr-defined]
        log.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- the bind guard
def test_memeflow_api_refuses_an_unauthenticated_remote_bind(env):
    port = free_port()
    r = run([*MEMEFLOW, "api", "--host", "0.0.0.0", "--port", str(port)], env)
    assert r.returncode == 1
    assert "refusing to serve the API on 0.0.0.0 with MEMEFLOW_AUTH=none" in r.stderr
    assert "MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1" in r.stderr
    assert not port_open(port)


def test_gunicorn_with_the_memeflow_config_refuses_before_binding(env):
    port = free_port()
    cmd = [PYTHON, "-m", "gunicorn", "-c", "python:app.api.gunicorn_conf", "app.api.wsgi:app", "-b", f"0.0.0.0:{port}"]
    r = run(cmd, env)
    assert r.returncode == 1
    assert "refusing to serve the API on 0.0.0.0" in r.stderr
    assert not port_open(port)


def test_the_opt_in_and_token_mode_may_bind_everywhere(env, spawn):
    port = free_port()
    proc = spawn([*MEMEFLOW, "api", "--host", "0.0.0.0", "--port", str(port), "--workers", "1"],
                 {**env, "MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE": "1"}, "api-optin")
    poll_until(lambda: port_open(port) or proc.poll() is not None, timeout=60, what="api up")
    assert proc.poll() is None, proc.log_path.read_text()
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    # the Host allow-list still applies to this instance
    r = requests.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": "rebind.example"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "invalid_host"


def _own_non_loopback_ip() -> str | None:
    """An IPv4 address of this machine that is not loopback (connecting to it is a 'remote' peer)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_a_server_started_without_the_guards_still_serves_no_remote_peer(env, spawn):
    """Plain ``gunicorn -b 0.0.0.0`` (no memeflow config): the API itself answers 403 to a
    non-loopback peer in MEMEFLOW_AUTH=none, and serves loopback."""
    ip = _own_non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = free_port()
    proc = spawn([PYTHON, "-m", "gunicorn", "app.api.wsgi:app", "-b", f"0.0.0.0:{port}", "-w", "1"], env, "plain")
    poll_until(lambda: port_open(port) or proc.poll() is not None, timeout=60, what="gunicorn up")
    assert proc.poll() is None, proc.log_path.read_text()
    assert requests.get(f"http://127.0.0.1:{port}/api/v1/images", timeout=10).status_code == 200
    r = requests.get(f"http://{ip}:{port}/api/v1/images", headers={"Host": "localhost"}, timeout=10)
    assert r.status_code == 403 and r.json()["error"] == "unauthenticated_remote"


def test_the_stack_refuses_before_starting_anything(settings):
    stack = Stack(settings.replace(auth="none", api_host="0.0.0.0", database_url=None, broker_url=None))
    with pytest.raises(UnsafeBind, match="MEMEFLOW_AUTH=none"):
        stack.start()
    assert stack.children == [] and stack._services is None
    assert not (Path(settings.var_dir) / "postgres").exists()


def test_memeflow_up_exits_with_the_message(env):
    r = run([*MEMEFLOW, "up", "--no-flower"], {**env, "MEMEFLOW_API_HOST": "0.0.0.0"})
    assert r.returncode == 1
    assert "refusing to serve the API on 0.0.0.0" in r.stderr


# --------------------------------------------------------------------------- slow clients
def test_the_api_keeps_serving_while_slow_clients_hold_connections(env, spawn):
    """One worker, as configured (gthread, 16 threads): 6 silent connections plus 6 clients
    dribbling headers leave a normal request fast. A sync worker serves one connection at a time
    and hangs behind the first of them (checked: this test fails with worker_class "sync", threads 1)."""
    port = free_port()
    proc = spawn(api_cmd("127.0.0.1", port, workers=1), env, "api-slow")
    poll_until(lambda: port_open(port) or proc.poll() is not None, timeout=60, what="api up")
    assert proc.poll() is None, proc.log_path.read_text()
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    held: list[socket.socket] = []
    try:
        for _ in range(6):  # connected, never send a byte
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        dribblers = []
        for _ in range(6):  # a request line and then one header line now and then, never finished
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            dribblers.append(s)
            held.append(s)
        for round_ in range(3):
            for s in dribblers:
                with contextlib.suppress(OSError):
                    s.sendall(f"X-Slow-{round_}: 1\r\n".encode())
            started = time.monotonic()
            r = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            assert r.status_code == 200
            assert time.monotonic() - started < 2.5  # normally milliseconds; margin for a loaded box
    finally:
        for s in held:
            s.close()


# --------------------------------------------------------------------------- Flower credentials
def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def test_flower_credentials_never_appear_on_a_command_line(env, spawn):
    secret = "flower-pass-7Yq2"
    port = free_port()
    fenv = {**env, "MEMEFLOW_FLOWER_BASIC_AUTH": f"ops:{secret}"}
    proc = spawn([*MEMEFLOW, "flower", "--port", str(port)], fenv, "flower")
    poll_until(lambda: port_open(port) or proc.poll() is not None, timeout=90, interval=0.2, what="flower up")
    assert proc.poll() is None, proc.log_path.read_text()
    cmdlines = [" ".join(p.cmdline()) for p in _tree(proc.pid)]
    assert any("flower" in c for c in cmdlines)
    assert not any(secret in c for c in cmdlines), cmdlines
    # ...and the credentials are in force
    url = f"http://127.0.0.1:{port}/"
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, auth=("ops", "wrong"), timeout=10).status_code == 401
    assert requests.get(url, auth=("ops", secret), timeout=10).status_code == 200
    # docker-compose's healthcheck pipeline, unchanged but for the port, authenticates the same way
    import yaml

    check = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["flower"]["healthcheck"]["test"][1]
    check = check.replace("$$", "$").replace("127.0.0.1:5555/healthcheck", f"127.0.0.1:{port}/")
    assert run(["sh", "-c", check], fenv).returncode == 0
    assert run(["sh", "-c", check], {**fenv, "MEMEFLOW_FLOWER_BASIC_AUTH": "ops:wrong"}).returncode != 0


def test_the_stack_passes_flower_credentials_in_the_environment(settings):
    stack = Stack(settings.replace(flower_basic_auth="ops:stack-secret"), components=("flower",))
    stack.database_url, stack.broker_url = settings.database_url, settings.broker_url
    (child,) = stack._plan()
    assert not any("stack-secret" in arg for arg in child.cmd)
    assert child.env["FLOWER_BASIC_AUTH"] == "ops:stack-secret"


def test_flower_refuses_a_remote_bind_without_credentials(env):
    r = run([*MEMEFLOW, "flower", "--address", "0.0.0.0", "--port", str(free_port())], env)
    assert r.returncode == 1 and "MEMEFLOW_FLOWER_BASIC_AUTH" in r.stderr
