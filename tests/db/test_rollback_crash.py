"""A rollback killed right after its switch commits must still leave the previous model complete:
the images added since the cutover lack it, and a pinned scope starts no backfill, so only the
rollback's own fill batch ever embeds them with it (app/orchestrator/serving.py::rollback)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from sqlalchemy import event

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from tests.conftest import poll_until
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B

A, B = "deterministic-text-v1", "deterministic-text-b"


class Killed(BaseException):
    """The process died (not an Exception: nothing on the way up handles it)."""


@contextmanager
def killed_after_first_commit(engine):
    """Whatever runs inside dies at its first statement after its first commit — what
    a process killed right after that commit leaves behind."""
    committed = []

    def on_commit(conn):
        committed.append(True)

    def on_statement(conn, *args):
        if committed:
            raise Killed("killed after the first commit")

    event.listen(engine, "commit", on_commit)
    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        yield
    finally:
        event.remove(engine, "commit", on_commit)
        event.remove(engine, "before_cursor_execute", on_statement)


def test_a_rollback_killed_after_its_switch_still_fills_the_previous_model(engine, settings):
    clock, pub = FakeClock(), RecordingPublisher()
    old = Orchestrator(engine, settings, clock=clock)
    for i in range(3):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    for _ in range(4):
        drive(old, pub, Providers(settings), clock)  # processed with A; serving bootstrapped

    new_settings = settings.replace(text_provider=SPEC_B, search_cutover_check_s=3600.0)
    new, providers = Orchestrator(engine, new_settings, clock=clock), Providers(new_settings)
    pub.publish(new.sweep().hints)  # backfill towards B
    assert new.search_cutover("s1")["model"] == B
    for i in range(3, 6):  # added while B alone is served: embedded with B only
        pub.publish(store_and_ingest(new, "s1", png_bytes(i)).hints)

    def covered_by_b():
        drive(new, pub, providers, clock)
        cov = new.search_serving_status("s1")["coverage"]
        return cov == {"ready": 6, "total": 6}

    poll_until(covered_by_b, timeout=60, interval=0, what="B covers every image")
    assert new.search_serving_status("s1")["previous"]["model"] == A

    with killed_after_first_commit(engine), pytest.raises(Killed):
        new.search_rollback("s1")
    pub.drain()  # whatever the dead process had queued to publish is lost with it
    st = new.search_serving_status("s1")
    assert (st["state"], st["model"]) == ("pinned", A)  # the switch back committed
    assert st["coverage"]["ready"] == 3  # the three images added since the cutover lack A

    def covered_by_a():
        drive(new, pub, providers, clock)  # the normal sweep and workers, nothing else
        return new.search_serving_status("s1")["coverage"] == {"ready": 6, "total": 6}

    poll_until(covered_by_a, timeout=30, interval=0, what="A covers every image again")
    assert new.search_serving_status("s1")["state"] == "pinned"
