"""An operator's early cutover during a model backfill must not stop the fill: the images the
target still lacks are "found by their words only until the fill covers them"
(docs/operations.md), so the fill has to go on covering them."""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B

B = "deterministic-text-b"


def test_an_early_cutover_keeps_filling_what_the_target_lacks(engine, settings):
    clock, pub = FakeClock(), RecordingPublisher()
    old = Orchestrator(engine, settings, clock=clock)
    for i in range(4):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    drive(old, pub, Providers(settings), clock, rounds=4)  # processed with A; the sweep bootstraps serving
    assert rows(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == 4

    new_settings = settings.replace(text_provider=SPEC_B, search_cutover_check_s=3600.0)
    new = Orchestrator(engine, new_settings, clock=clock)
    pub.publish(new.sweep().hints)  # backfill towards B, fill batch attached (first page seeded)
    assert new.search_serving_status("s1")["state"] == "backfill"
    st = new.search_cutover("s1")  # the operator does not wait
    assert (st["state"], st["model"]) == ("serving", B)

    drive(new, pub, Providers(new_settings), clock, rounds=8)
    cov = new.search_serving_status("s1")["coverage"]
    assert cov == {"ready": 4, "total": 4}, cov  # the fill went on: every image searchable by B
