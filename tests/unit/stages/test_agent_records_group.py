"""Group commit of the local agents' result records: concurrent writes share one data file (one
fsync) hard-linked under every attempt's name (one directory fsync), each durable before its
``write`` returns, each found by its attempt id, and partial or failed groups leave nothing a
lookup could mistake for a finished attempt."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest

from app.stages.agent import records
from app.stages.base import AgentResult
from tests.conftest import poll_until

NS = "0f" * 16


def _result(i: int) -> AgentResult:
    return AgentResult(context={"title": f"t{i}", "description": "", "ocr_text": "", "tags": [], "facts": {}},
                       model="m", request_id=f"r{i}")


def _ids(n: int) -> list[str]:
    return [f"{i:02x}" * 16 for i in range(n)]


def _grouped_writes(rec: records.ResultRecords, ids: list[str], namespace: str | None = NS,
                    on_started=None) -> dict[str, object]:
    """Write ``ids`` from one thread each, as the calls of one agent batch (a CallGroup whose
    linger is long enough that only its count decides). Returns {attempt_id: Path or the
    exception its write raised}."""
    group = records.CallGroup(len(ids), linger_s=60)
    out: dict[str, object] = {}

    def one(i: int, attempt_id: str) -> None:
        try:
            with records.in_namespace(namespace or NS) if namespace else contextlib.nullcontext(), \
                    records.in_group(group):
                out[attempt_id] = rec.write(attempt_id, _result(i))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out[attempt_id] = exc

    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return out


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_concurrent_writes_share_one_data_file_and_every_attempt_reads_its_own(tmp_path, monkeypatch):
    rec, ids = records.ResultRecords(tmp_path), _ids(6)
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    out = _grouped_writes(rec, ids)
    directory = tmp_path / NS
    assert out == {a: directory / f"{a}.json" for a in ids}
    assert rec.flushes == 1
    assert len(fsyncs) == 2  # the data file and the directory, once each, for six records
    assert _names(directory) == sorted(f"{a}.json" for a in ids)  # no temp name left
    group = [directory / f"{a}.json" for a in ids]
    assert {p.stat().st_ino for p in group} == {group[0].stat().st_ino}  # one inode, six names
    assert group[0].stat().st_nlink == 6
    data = json.loads(group[0].read_bytes())
    assert data["format"] == "memeflow-agent-records-v2" and sorted(data["records"]) == sorted(ids)
    fresh = records.ResultRecords(tmp_path)  # "another process"
    with records.in_namespace(NS):
        assert [fresh.read(a) for a in ids] == [_result(i) for i in range(6)]
        assert fresh.read("ee" * 16) is None


def test_discarding_some_attempts_of_a_group_keeps_the_others_adoptable(tmp_path):
    rec, ids = records.ResultRecords(tmp_path), _ids(5)
    _grouped_writes(rec, ids)
    records.discard(tmp_path, NS, ids[1:3])  # committed; the others still in flight (e.g. fenced out)
    with records.in_namespace(NS):
        assert [rec.read(a) for a in ids] == [_result(0), None, None, _result(3), _result(4)]
    assert (tmp_path / NS / f"{ids[3]}.json").stat().st_nlink == 3
    # gc: only ids[4] still open; the data goes with its last name
    removed = records.prune(tmp_path, lambda got: {ids[4]} & set(got), min_age_s=0)
    assert sorted(p.name for p in removed) == sorted(f"{a}.json" for a in (ids[0], ids[3]))
    assert _names(tmp_path / NS) == [f"{ids[4]}.json"]
    assert (tmp_path / NS / f"{ids[4]}.json").stat().st_nlink == 1
    with records.in_namespace(NS):
        assert rec.read(ids[4]) == _result(4)


def test_records_of_different_namespaces_never_share_a_file(tmp_path):
    rec, ids, other = records.ResultRecords(tmp_path), _ids(5), "1a" * 16
    group = records.CallGroup(5, linger_s=60)

    def one(i):
        with records.in_namespace(NS if i % 2 else other), records.in_group(group):
            rec.write(ids[i], _result(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert rec.flushes == 1
    for namespace, mine in ((NS, [1, 3]), (other, [0, 2, 4])):
        for i in mine:
            data = json.loads((tmp_path / namespace / f"{ids[i]}.json").read_bytes())
            assert set(data["records"]) == {ids[j] for j in mine}, namespace
    with records.in_namespace(other):
        assert rec.read(ids[1]) is None  # another scope's attempt is not found here


def test_a_crash_before_the_names_leaves_only_a_temp_file_that_no_lookup_adopts(tmp_path, monkeypatch):
    """Crash after the data file is fsync'd, before (or while) the attempts' names are linked:
    the linked ones are complete records, the others are 'never received', nothing is torn."""
    rec, ids = records.ResultRecords(tmp_path), _ids(5)
    real_link, linked = os.link, []

    class Crash(Exception):
        pass

    def link(src, dst, *a, **kw):
        if len(linked) == 2:
            raise Crash()  # the process dies here
        linked.append(dst)
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", link)
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):  # a dead process cleans nothing up
        if self.name.startswith(".group-"):
            return None
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    out = _grouped_writes(rec, ids)
    assert all(isinstance(out[a], Crash) for a in ids)  # no write of the group returned
    fresh = records.ResultRecords(tmp_path)
    with records.in_namespace(NS):
        found = {a: fresh.read(a) for a in ids}
    adopted = {Path(p).stem for p in linked}
    assert len(adopted) == 2
    assert {a for a, r in found.items() if r is not None} == adopted
    assert all(found[a] == _result(i) for i, a in enumerate(ids) if a in adopted)
    temps = [n for n in _names(tmp_path / NS) if n.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].startswith(".group-")
    monkeypatch.setattr(Path, "unlink", real_unlink)
    removed = records.prune(tmp_path, lambda got: set(got), min_age_s=0)  # every attempt still open
    assert [p.name for p in removed] == temps  # gc removes the stale temp name, never a record
    with records.in_namespace(NS):
        assert {a: fresh.read(a) for a in ids} == found


def test_a_failed_flush_fails_every_write_of_its_group(tmp_path, monkeypatch):
    rec, ids = records.ResultRecords(tmp_path), _ids(4)
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 1:  # the group's data file
            raise OSError(28, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = _grouped_writes(rec, ids)
    assert all(isinstance(out[a], OSError) for a in ids)
    assert _names(tmp_path / NS) == []  # nothing half-written remains
    assert rec.write(ids[1], _result(1)).is_file()  # and the records keep working


def test_without_hard_links_a_group_falls_back_to_one_file_per_attempt(tmp_path, monkeypatch):
    rec, ids = records.ResultRecords(tmp_path), _ids(4)

    def no_link(*a, **kw):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    out = _grouped_writes(rec, ids)
    assert out == {a: tmp_path / NS / f"{a}.json" for a in ids}
    assert _names(tmp_path / NS) == sorted(f"{a}.json" for a in ids)
    for i, a in enumerate(ids):
        assert AgentResult.from_json(json.loads((tmp_path / NS / f"{a}.json").read_bytes())) == _result(i)


def test_rewriting_an_attempt_in_a_group_replaces_its_record(tmp_path):
    rec, ids = records.ResultRecords(tmp_path), _ids(3)
    with records.in_namespace(NS):
        rec.write(ids[2], _result(9))
    _grouped_writes(rec, ids)
    with records.in_namespace(NS):
        assert rec.read(ids[2]) == _result(2)


@pytest.mark.parametrize("namespace", [None, NS])
def test_a_lone_record_keeps_the_single_result_format(tmp_path, namespace):
    rec = records.ResultRecords(tmp_path)
    if namespace is None:
        path = rec.write("ab" * 16, _result(1))
    else:
        with records.in_namespace(namespace):
            path = rec.write("ab" * 16, _result(1))
    assert AgentResult.from_json(json.loads(path.read_bytes())) == _result(1)
    assert _names(path.parent) == [path.name]


def _group_calls(rec, group, bodies):
    """Run each body as one call of ``group`` in its own thread (as an agent batch does)."""
    out: dict[int, object] = {}

    def call(i, body):
        try:
            with records.in_namespace(NS), records.in_group(group):
                out[i] = body(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    return threads, out


def test_a_batchs_calls_make_one_flush_however_they_are_spread(tmp_path):
    rec, ids, go = records.ResultRecords(tmp_path), _ids(4), threading.Event()
    group = records.CallGroup(4, linger_s=60)  # only the group's count decides here

    def body(i):
        go.wait(30)
        return rec.write(ids[i], _result(i))

    threads, out = _group_calls(rec, group, [body] * 4)
    go.set()
    for t in threads:
        t.join(timeout=60)
    assert out == {i: tmp_path / NS / f"{a}.json" for i, a in enumerate(ids)}
    assert rec.flushes == 1 and group.computing == 0
    assert (tmp_path / NS / f"{ids[0]}.json").stat().st_nlink == 4


def test_a_call_that_fails_before_its_record_does_not_hold_the_others(tmp_path):
    rec, ids = records.ResultRecords(tmp_path), _ids(3)
    group = records.CallGroup(3, linger_s=60)

    def writes(i):
        return rec.write(ids[i], _result(i))

    def raises(i):
        poll_until(lambda: len(group.pending) == 2, timeout=30, what="the others waiting")
        raise RuntimeError("provider failed")

    threads, out = _group_calls(rec, group, [writes, writes, raises])
    for t in threads:
        t.join(timeout=60)
    assert isinstance(out[2], RuntimeError)
    assert out[0].is_file() and out[1].is_file() and rec.flushes == 1


def test_a_slow_call_holds_the_others_records_at_most_the_linger(tmp_path):
    rec, ids, release = records.ResultRecords(tmp_path), _ids(3), threading.Event()
    # a linger is counted from each record's own arrival: the two fast calls' records are flushed
    # together only if the second arrives within the first's linger. Their threads start one after
    # the other, and a loaded box can put more than the default 50 ms between them (the first then
    # flushes alone: two flushes); a second is far more than that, and the slow call still never comes.
    group = records.CallGroup(3, linger_s=1.0)

    def slow(i):
        release.wait(60)
        return rec.write(ids[i], _result(i))

    threads, out = _group_calls(rec, group, [lambda i: rec.write(ids[i], _result(i))] * 2 + [slow])
    poll_until(lambda: 0 in out and 1 in out, timeout=30, what="the two fast records durable")
    assert rec.flushes == 1 and 2 not in out  # flushed without waiting for the slow call
    release.set()
    for t in threads:
        t.join(timeout=60)
    assert out[2].is_file() and rec.flushes == 2


def test_records_outside_a_group_never_wait_for_each_other(tmp_path, monkeypatch):
    """One call per thread (local-ocr in a threads pool): each record is flushed at once, while
    another thread's flush is still under way."""
    rec, ids, release = records.ResultRecords(tmp_path), _ids(2), threading.Event()
    real_single = records._write_single

    def single(directory, entry):
        if entry.attempt_id == ids[0]:
            release.wait(60)  # the first record's flush hangs (a slow disk)
        return real_single(directory, entry)

    monkeypatch.setattr(records, "_write_single", single)
    out: dict[str, Path] = {}
    slow = threading.Thread(target=lambda: out.setdefault(ids[0], rec.write(ids[0], _result(0))))
    slow.start()
    out[ids[1]] = rec.write(ids[1], _result(1))  # returns while the other flush still hangs
    assert out[ids[1]].is_file() and ids[0] not in out
    release.set()
    slow.join(timeout=60)
    assert out[ids[0]].is_file() and rec.flushes == 2


class _CountingCondition(threading.Condition):
    """Counts the times a waiting thread was woken (or timed out) and went on."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def wait(self, timeout=None):
        woke = super().wait(timeout)
        self.wakeups += 1  # under the lock again
        return woke


def test_a_group_wakes_its_waiting_writers_a_bounded_number_of_times(tmp_path, monkeypatch):
    # A waiting record checks two things: are calls of its group still computing, is a flush
    # running. An arrival that leaves calls computing changes neither, so it must not wake the
    # waiters: a wake-up per waiter per arrival is up to n(n−1)/2 for a batch of n (228 counted for 24) — CPU the
    # agent worker spent for nothing (performance log §51).
    cond = _CountingCondition()
    monkeypatch.setattr(records, "_COND", cond)
    rec, ids = records.ResultRecords(tmp_path), _ids(24)
    out = _grouped_writes(rec, ids)
    assert out == {a: tmp_path / NS / f"{a}.json" for a in ids}
    assert rec.flushes == 1
    # each waiter wakes when the last call arrives, and at most once more when the flush ends
    assert cond.wakeups <= 2 * len(ids)
