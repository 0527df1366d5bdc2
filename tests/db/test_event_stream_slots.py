"""Stream slots (``event_stream_slots``): a scope's ``event_streams_per_scope`` live streams. As
many streams as there are free slots, opened at the same moment (every EventSource of a scope
reconnecting after an API restart), all get one: a racing open never answers 429 while a slot is
free (EventSource does not reconnect after a 429)."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import pytest

from app.orchestrator import Orchestrator
from app.orchestrator.errors import TooManyStreams


def _race_for_slots(orch: Orchestrator, n: int) -> tuple[list[int], list[BaseException]]:
    """``n`` opens of the scope's stream at once; each holds its slot until all have answered."""
    start = threading.Barrier(n)
    answered = threading.Barrier(n + 1)
    release = threading.Event()
    got: list[int] = []
    refused: list[BaseException] = []

    def open_stream() -> None:
        start.wait(timeout=30)
        try:
            with orch.stream_slot("local") as slot:
                got.append(slot.slot_no)
                answered.wait(timeout=30)
                release.wait(timeout=30)
                return
        except TooManyStreams as exc:
            refused.append(exc)
        answered.wait(timeout=30)

    threads = [threading.Thread(target=open_stream) for _ in range(n)]
    for t in threads:
        t.start()
    answered.wait(timeout=30)
    release.set()
    for t in threads:
        t.join(timeout=30)
    return got, refused


def test_as_many_simultaneous_opens_as_free_slots_all_get_one(engine, settings):
    n = 6
    orch = Orchestrator(engine, settings.replace(event_streams_per_scope=n))
    orch.ensure_scope("local")
    for _ in range(5):  # rounds: the n opens of each race for the n free slots
        got, refused = _race_for_slots(orch, n)
        assert refused == [] and sorted(got) == list(range(n))
    # the bound still holds: with every slot held, one more open is refused
    with ExitStack() as held:
        for _ in range(n):
            held.enter_context(orch.stream_slot("local"))
        with pytest.raises(TooManyStreams), orch.stream_slot("local"):
            pass
