"""app.api.shares: a process's streams and searches shared fairly among scopes (no server, no DB)."""

from __future__ import annotations

import threading

import pytest

from app.api import shares as shares_mod
from app.api.shares import FairShares, ShareRefused
from app.metrics import API_SHARE_REFUSALS, API_SHARE_YIELDS


def _yield_on_stop(share, done: threading.Event) -> threading.Thread:
    """A stream's thread: gives its share back once told to yield."""
    def run() -> None:
        assert share.stop.wait(30)
        share.release()
        done.set()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_newcomer_below_its_share_takes_the_oldest_share_of_the_scope_holding_most():
    pool = FairShares()
    yields = API_SHARE_YIELDS.labels(kind="shares")._value.get()
    a1, a2 = pool.acquire("a", 4, preempt=True), pool.acquire("a", 4, preempt=True)
    b1 = pool.acquire("b", 4, preempt=True)
    a3 = pool.acquire("a", 4, preempt=True)  # a: 3, b: 1 — full
    done = threading.Event()
    t = _yield_on_stop(a1, done)
    c1 = pool.acquire("c", 4, preempt=True, handoff_s=30)  # fair share 4 // 3 = 1: c has 0, a has 3
    t.join(30)
    assert done.is_set() and not a2.stop.is_set() and not a3.stop.is_set() and not b1.stop.is_set()
    assert pool.by_scope() == {"a": 2, "b": 1, "c": 1} and pool.held() == 4
    assert API_SHARE_YIELDS.labels(kind="shares")._value.get() == yields + 1
    with pytest.raises(ShareRefused):  # c holds its share (4 // 3 = 1) now: no second one at a's expense
        pool.acquire("c", 4, preempt=True, handoff_s=30)
    assert not a2.stop.is_set() and c1.scope == "c"


def test_at_its_fair_share_a_scope_is_refused_and_nobody_yields():
    pool = FairShares()
    held = [pool.acquire(s, 4, preempt=True) for s in ("a", "a", "b", "c")]
    with pytest.raises(ShareRefused) as refused:
        pool.acquire("c", 4, preempt=True, handoff_s=30)  # c holds 1 = 4 // 3; a holds 2 > 1, but c is not below
    assert refused.value.why == "process"
    assert not any(s.stop.is_set() for s in held)
    # with as many scopes as shares, each holding one, another scope is refused: nobody holds more
    pool2 = FairShares()
    ones = [pool2.acquire(s, 2, preempt=True) for s in ("a", "b")]
    with pytest.raises(ShareRefused):
        pool2.acquire("c", 2, preempt=True)
    assert not any(s.stop.is_set() for s in ones)


def test_a_victim_that_does_not_give_its_thread_back_in_time_leaves_the_newcomer_refused():
    pool = FairShares()
    a1, _ = pool.acquire("a", 2, preempt=True), pool.acquire("a", 2, preempt=True)
    with pytest.raises(ShareRefused):
        pool.acquire("b", 2, preempt=True, handoff_s=0.01)  # a1 never releases in this test
    assert a1.stop.is_set() and pool.held() == 2
    a1.release()  # late: its thread is free now, no newcomer waits for it
    assert pool.held() == 1
    assert pool.acquire("b", 2, preempt=True).scope == "b"


def test_a_refused_scope_gets_the_next_free_share_before_a_scope_at_its_share(monkeypatch):
    clock = [100.0]
    pool = FairShares("searches", clock=lambda: clock[0])
    a = [pool.acquire("a", 2, per_scope=2) for _ in range(2)]
    with pytest.raises(ShareRefused) as refused:
        pool.acquire("b", 2, per_scope=2)
    assert refused.value.why == "process"
    a[0].release()
    with pytest.raises(ShareRefused):  # a holds 1 = 2 // 2 while b waits below its share
        pool.acquire("a", 2, per_scope=2)
    b = pool.acquire("b", 2, per_scope=2)
    b.release()
    clock[0] += shares_mod.WANT_MEMORY_S  # b did not come back: its claim lapses
    assert pool.acquire("a", 2, per_scope=2).scope == "a"


def test_the_per_scope_bound_and_idempotent_release():
    pool = FairShares()
    s1 = pool.acquire("a", 8, per_scope=1)
    refusals = API_SHARE_REFUSALS.labels(kind="shares", why="scope")._value.get()
    with pytest.raises(ShareRefused) as refused:
        pool.acquire("a", 8, per_scope=1)
    assert refused.value.why == "scope"
    assert API_SHARE_REFUSALS.labels(kind="shares", why="scope")._value.get() == refusals + 1
    s1.release()
    s1.release()
    assert pool.held() == 0 and pool.by_scope() == {}
