"""A rollback after a cutover serves the previous model again — only while its rows are kept. With
old-model retention on (``MEMEFLOW_RETENTION_OLD_MODELS_S``) they go once the rollback window
(``MEMEFLOW_SEARCH_ROLLBACK_WINDOW_S``) has passed since the switch: a rollback then would serve a
model with no rows, semantic search empty until a refill. It is refused (409), and the reads stay."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.errors import ServingStateConflict
from app.stages.providers import Providers
from tests.conftest import poll_until
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B

A, B = "deterministic-text-v1", "deterministic-text-b"
DAY = 86400.0


def _cut_over_to_b(engine, settings, clock, pub) -> Orchestrator:
    old = Orchestrator(engine, settings, clock=clock)
    for i in range(3):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    drive(old, pub, Providers(settings), clock, rounds=3)
    new_settings = settings.replace(text_provider=SPEC_B, search_cutover_check_s=0.0, retention_old_models_s=DAY,
                                    search_rollback_window_s=7 * DAY)
    new, providers = Orchestrator(engine, new_settings, clock=clock), Providers(new_settings)

    def switched():
        drive(new, pub, providers, clock)
        return new.search_serving_status("s1", "text")["model"] == B

    poll_until(switched, timeout=60, interval=0, what="the cutover to B")
    return new


def test_a_rollback_past_the_window_is_refused_once_old_rows_may_be_gone(engine, settings):
    clock, pub = FakeClock(datetime.now(timezone.utc)), RecordingPublisher()
    new = _cut_over_to_b(engine, settings, clock, pub)
    clock.advance(8 * DAY)  # past the rollback window and the old-model age
    for _ in range(3):
        pub.publish(new.sweep().hints)  # retention prunes the replaced model's rows
    assert rows(engine, "SELECT count(*) FROM text_embeddings WHERE model = :m", m=A)[0][0] == 0
    with pytest.raises(ServingStateConflict):
        new.search_rollback("s1", "text")
    state = new.search_serving_status("s1", "text")
    assert (state["state"], state["model"], state["coverage"]) == ("serving", B, {"ready": 3, "total": 3})


def test_a_rollback_within_the_window_serves_the_previous_model(engine, settings):
    clock, pub = FakeClock(datetime.now(timezone.utc)), RecordingPublisher()
    new = _cut_over_to_b(engine, settings, clock, pub)
    clock.advance(6 * DAY)
    pub.publish(new.sweep().hints)
    doc, _ = new.search_rollback("s1", "text")
    assert (doc["state"], doc["model"], doc["coverage"]) == ("pinned", A, {"ready": 3, "total": 3})
