"""A warm worker moves its start-up objects into the collector's permanent generation."""

from __future__ import annotations

import gc
import weakref

import pytest

from app.worker import tasks


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # this test process is not a worker: give its objects back to the collector


class _Startup:
    """A start-up object that sits in a reference cycle."""

    def __init__(self):
        self.me = self


def test_freeze_moves_what_is_alive_out_of_the_collected_generations(unfrozen, monkeypatch):
    monkeypatch.delenv(tasks.GC_FREEZE_ENV, raising=False)
    before = _Startup()
    assert gc.get_freeze_count() == 0 and gc.is_tracked(before)

    assert tasks.freeze_startup_objects() is True
    assert gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    # a full collection no longer walks the frozen objects: `before` is in none of the generations
    assert not any(obj is before for obj in gc.get_objects())
    after = _Startup()  # made after the freeze: in the collected generations as usual
    assert any(obj is after for obj in gc.get_objects())
    gc.collect()
    # the collection leaves frozen objects frozen: `before` is still outside the generations. The
    # count itself may shrink (a frozen object another thread of this process drops is freed by
    # its refcount), never grow: nothing is frozen by a collection
    assert not any(obj is before for obj in gc.get_objects())
    assert 0 < gc.get_freeze_count() <= frozen


def test_freeze_collects_start_up_garbage_first(unfrozen, monkeypatch):
    monkeypatch.delenv(tasks.GC_FREEZE_ENV, raising=False)
    gc.disable()  # keep the cycle uncollected until the freeze's own collection
    try:
        cycle = _Startup()
        garbage = weakref.ref(cycle)
        del cycle
        assert garbage() is not None  # a cycle: only the collector frees it
        tasks.freeze_startup_objects()
        assert garbage() is None  # collected, not frozen forever
    finally:
        gc.enable()


@pytest.mark.parametrize("value", ["0", "off", "false", " NO "])
def test_the_setting_turns_it_off(unfrozen, monkeypatch, value):
    monkeypatch.setenv(tasks.GC_FREEZE_ENV, value)
    assert tasks.freeze_startup_objects() is False
    assert gc.get_freeze_count() == 0


def test_a_prefork_child_freezes_after_loading_its_providers(unfrozen, monkeypatch):
    monkeypatch.delenv(tasks.GC_FREEZE_ENV, raising=False)
    order = []
    monkeypatch.setattr(tasks, "reset_runtime", lambda: order.append("reset"))
    monkeypatch.setattr(tasks, "_preload_from_env", lambda concurrency=None: order.append("preload"))
    monkeypatch.setattr(tasks, "freeze_startup_objects", lambda: order.append("freeze"))
    tasks._fresh_runtime_in_child()
    assert order == ["reset", "preload", "freeze"]
