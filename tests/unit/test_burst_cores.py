"""The cores a batch may use at the end of a burst (app/stages/cpu.burst, app/worker/run.burst_cores)."""

from __future__ import annotations

import contextvars
import threading

import pytest

from app.config import Settings
from app.stages import cpu
from app.worker import run


def test_burst_cores_default_to_one_and_the_block_sets_and_restores_them():
    assert cpu.burst_cores() == 1
    with cpu.burst(3):
        assert cpu.burst_cores() == 3
        with cpu.burst(0):  # never below one
            assert cpu.burst_cores() == 1
        assert cpu.burst_cores() == 3
    assert cpu.burst_cores() == 1
    seen = []
    with cpu.burst(2):  # another thread is not inside this thread's burst
        t = threading.Thread(target=lambda: seen.append(cpu.burst_cores()))
        t.start()
        t.join()
    assert seen == [1]


def test_run_concurrently_keeps_order_context_and_the_first_error():
    marker = contextvars.ContextVar("marker", default="none")
    marker.set("caller")
    names: set[str] = set()

    def call(i):
        def go():
            names.add(threading.current_thread().name)
            return (i, cpu.burst_cores(), marker.get())
        return go

    with cpu.burst(2):
        out = cpu.run_concurrently([call(i) for i in range(5)], 2)
    assert out == [(i, 2, "caller") for i in range(5)]
    assert names and all(n.startswith("burst") for n in names) and len(names) <= 2
    assert cpu.run_concurrently([call(0), call(1)], 1) == [(0, 1, "caller"), (1, 1, "caller")]  # inline
    ran = []

    def boom(msg):
        def go():
            ran.append(msg)
            raise ValueError(msg)
        return go

    with pytest.raises(ValueError, match="first"):
        cpu.run_concurrently([call(0), boom("first"), boom("second")], 2)
    assert sorted(ran) == ["first", "second"]  # every call ended before the error was raised


class _Asked:
    def __init__(self, queued: bool, running: bool) -> None:
        self.answer, self.calls = (queued, running), 0

    def __call__(self) -> tuple[bool, bool]:
        self.calls += 1
        return self.answer


def test_a_lane_fed_by_earlier_lanes_gets_every_core_only_while_they_are_idle(monkeypatch):
    settings = Settings(local_burst_cores=2)
    idle = _Asked(False, False)
    assert run.burst_cores(settings, idle) == 2 and idle.calls == 1  # the end of a burst
    for queued, running in ((True, False), (False, True), (True, True)):  # a visual or agent task queued/running
        busy = _Asked(queued, running)
        assert run.burst_cores(settings, busy) == 1 and busy.calls == 1
    # the linger's last answer is used as is: no second question
    assert run.burst_cores(settings, idle, state=(False, False)) == 2 and idle.calls == 1
    assert run.burst_cores(settings, idle, state=(False, True)) == 1 and idle.calls == 1
    # the first lane (nothing feeds it but uploads), and a burst switched off: one core, nothing asked
    assert run.burst_cores(settings, None) == 1
    assert run.burst_cores(Settings(local_burst_cores=1), idle) == 1 and idle.calls == 1
    # off by default (1); 0: the cores the worker may use
    assert Settings().local_burst_cores == 1 and run.burst_cores(Settings(), idle) == 1
    monkeypatch.setattr(cpu, "available_cores", lambda: 4)
    assert run.burst_cores(Settings(local_burst_cores=0), idle) == 4
    monkeypatch.setattr(cpu, "available_cores", lambda: 1)
    assert run.burst_cores(Settings(local_burst_cores=0), idle) == 1


def test_burst_cores_setting_is_validated():
    from app.config import SettingsError

    assert Settings.from_env({"MEMEFLOW_LOCAL_BURST_CORES": "3"}).local_burst_cores == 3
    with pytest.raises(SettingsError):
        Settings.from_env({"MEMEFLOW_LOCAL_BURST_CORES": "-1"})
