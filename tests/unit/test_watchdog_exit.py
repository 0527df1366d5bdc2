"""The watchdog's way out (app/worker/watchdog.py) when the hung thread holds what the exit path
needs: a provider blocked inside a log call (a logging handler's lock held: its stream a pipe that
no longer drains) or inside a write to stdout/stderr (the stream's buffer lock held). The watchdog
must still note the overrun and end the process — nothing on its way out may wait without bound."""

from __future__ import annotations

import logging
import threading
import types

import pytest

from app.worker import watchdog


class _Orch:
    def __init__(self) -> None:
        self.noted: list[dict] = []

    def note_overrun(self, claims, error) -> None:
        self.noted.append(error)


class _Hb:
    def __init__(self) -> None:
        self.orch = _Orch()
        self.claims = [types.SimpleNamespace(task_id="t1", job_id="j1", scope_id="s1", stage="visual",
                                             generation=1)]
        self.stopped = threading.Event()

    def stop_beating(self) -> None:
        self.stopped.set()


class _Quiet(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        pass


class _BlockedStream:
    """A stream whose flush never returns (its buffer lock held by a thread blocked in a write)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def write(self, text: str) -> int:
        self.gate.wait()
        return len(text)

    def flush(self) -> None:
        self.gate.wait()


def test_a_provider_blocked_in_a_log_call_does_not_keep_the_watchdog_from_ending_the_process(monkeypatch):
    ended = threading.Event()
    monkeypatch.setattr(watchdog, "end_process", lambda code: ended.set())
    monkeypatch.setattr(watchdog, "NOTE_TIMEOUT_S", 0.5)
    handler = _Quiet()  # stands for the process's stderr handler
    logger = logging.getLogger(watchdog.__name__)
    logger.addHandler(handler)
    handler.acquire()  # the hung provider thread is inside this handler's emit
    ok = False
    try:
        hb = _Hb()
        call = watchdog.Call(1, "visual", "HangVisual", 0.1, 0.0)
        threading.Thread(target=watchdog.overrun, args=(hb, call), daemon=True).start()
        ok = ended.wait(20)
        assert ok, "the watchdog waited for ever on a logging handler a hung thread holds"
        assert hb.stopped.is_set()
        assert [e["code"] for e in hb.orch.noted] == ["stage_timeout"]  # the note did not wait on the log
    finally:
        logger.removeHandler(handler)
        if ok:  # else the blocked overrun stays blocked: let go, it would end the test process
            handler.release()


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_a_stream_that_no_longer_drains_does_not_keep_the_process_from_exiting(monkeypatch, name):
    exited = threading.Event()
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        exited.set()

    stream = _BlockedStream()
    monkeypatch.setattr(watchdog, "os", types.SimpleNamespace(_exit=fake_exit))
    monkeypatch.setattr(watchdog.sys, name, stream)
    threading.Thread(target=watchdog.end_process, args=(watchdog.STAGE_TIMEOUT_EXIT,), daemon=True).start()
    # not unblocked on failure: a blocked end_process let go after the test would end the test process
    assert exited.wait(20), f"end_process waited for ever on a blocked sys.{name}"
    assert codes == [watchdog.STAGE_TIMEOUT_EXIT]
    stream.gate.set()


def test_a_watchdog_that_cannot_start_a_thread_still_ends_the_process(monkeypatch):
    """A process out of threads (a leaking provider hit the limit): the note and the log line are
    lost, but the process still ends — the beater thread must not die with the worker left hung."""
    codes: list[int] = []
    monkeypatch.setattr(watchdog, "end_process", codes.append)
    monkeypatch.setattr(watchdog, "NOTE_TIMEOUT_S", 0.5)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    hb = _Hb()
    with pytest.raises(RuntimeError):  # told to the beater thread's excepthook once the process is ending
        watchdog.overrun(hb, watchdog.Call(1, "visual", "HangVisual", 0.1, 0.0))
    assert codes == [watchdog.STAGE_TIMEOUT_EXIT]


def test_end_process_without_a_thread_to_flush_with_still_exits(monkeypatch):
    codes: list[int] = []
    monkeypatch.setattr(watchdog, "os", types.SimpleNamespace(_exit=codes.append))

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError):
        watchdog.end_process(watchdog.STAGE_TIMEOUT_EXIT)
    assert codes == [watchdog.STAGE_TIMEOUT_EXIT]
