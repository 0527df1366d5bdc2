"""One `memeflow up` per var dir, and a port someone else holds is never taken for our API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from app.cli.processes import settings_env
from app.cli.stack import Stack, StackAlreadyRunning, StackError
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.slow


def _quiet(*args, **kwargs) -> None:
    pass


def test_a_second_stack_on_the_same_var_dir_fails_at_once(it_settings):
    first = Stack(it_settings, components=("beat",), echo=_quiet).start()
    try:
        pids = [c.proc.pid for c in first.children]
        with pytest.raises(StackAlreadyRunning, match=f"already running .*\\(pid {os.getpid()}\\)"):
            Stack(it_settings, components=("beat",), echo=_quiet).start()
        # `memeflow up` says so and exits 3 without starting (or stopping) anything
        env = {**os.environ, **settings_env(it_settings), "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-m", "app.cli", "up", "--no-flower"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert "already running" in r.stderr and "stopping" not in r.stdout
        assert [c.proc.pid for c in first.children if c.alive] == pids  # the first one untouched
    finally:
        first.stop()
    again = Stack(it_settings, components=("beat",), echo=_quiet).start()  # the lock went with the first
    again.stop()


def test_a_port_another_process_holds_is_not_taken_for_our_api(it_settings):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = Stack(it_settings.replace(api_port=port), components=("api",), echo=_quiet, start_timeout_s=60)
        with pytest.raises(StackError, match=f"port {port} is already in use"):
            stack.start()
    assert stack.children == []  # nothing left running
