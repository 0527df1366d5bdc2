"""serving.after_completions skips its serving-state read only when this thread's extra-models read
saw none of the completed claims' scopes in a backfill; otherwise (a backfill seen, or a claim it
did not read) it reads as before."""

from __future__ import annotations

import threading
import uuid

import pytest

from app.orchestrator import serving
from app.orchestrator.serving_reads import _remember_states, states_seen
from app.orchestrator.types import Claim


class Read(Exception):
    pass


class Engine:
    def connect(self):
        raise Read


class Orch:
    engine = Engine()


def claim(scope: str = "s1") -> Claim:
    return Claim(task_id=uuid.uuid4(), scope_id=scope, job_id=uuid.uuid4(), image_id=uuid.uuid4(),
                 image_sha256="0" * 64, stage="text_embedding", lane="embedding", owner="w", generation=1,
                 attempt_count=1, max_attempts=3, payload={}, storage_key="k")


def test_no_backfill_seen_no_read():
    a, b = claim("s1"), claim("s2")
    _remember_states([a, b], {"s1": {"state": "serving"}})  # s2: no serving row
    serving.after_completions(Orch(), ["s1", "s2"], "text", [a, b])  # no Read raised


@pytest.mark.parametrize("rows", [{"s1": {"state": "backfill"}}, {"s2": {"state": "backfill"}}])
def test_a_backfill_seen_reads(rows):
    a, b = claim("s1"), claim("s2")
    _remember_states([a, b], rows)
    with pytest.raises(Read):
        serving.after_completions(Orch(), ["s1", "s2"], "text", [a, b])


def test_a_claim_not_read_here_reads():
    a, b = claim(), claim()
    _remember_states([a], {})
    with pytest.raises(Read):
        serving.after_completions(Orch(), ["s1"], "text", [a, b])
    with pytest.raises(Read):
        serving.after_completions(Orch(), ["s1"], "text", None)


def test_another_threads_read_does_not_count():
    a = claim()
    t = threading.Thread(target=_remember_states, args=([a], {}))
    t.start()
    t.join()
    assert states_seen([a]) is None
    with pytest.raises(Read):
        serving.after_completions(Orch(), ["s1"], "text", [a])
