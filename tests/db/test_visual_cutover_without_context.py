"""A visual model change must not drop images from look-alike search because their context is not
there yet: an image with a visual vector whose agent stage is still running (here: waiting for a
retry) is searchable by the old visual model, so the cutover to the new one waits until its own
job, which re-plans its visual stage once the agent lands, embeds it with the new model too."""

from __future__ import annotations

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.conftest import poll_until
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.poison import POISON_WIDTH
from tests.support.textmodels import VISUAL_SPEC_B

V1, VB = "deterministic-v1", "deterministic-visual-b"


def _visual_models(engine, image_id) -> set[str]:
    return {m for (m,) in rows(engine, "SELECT v.model FROM visual_embeddings v JOIN images i ON i.id = v.image_id"
                                       " AND i.sha256 = v.image_sha256 WHERE i.id = :i", i=image_id)}


def _visual_serving(orch) -> str:
    return orch.search_serving_status("s1", "visual")["model"]


def test_a_visual_cutover_waits_for_an_image_whose_context_is_still_coming(engine, settings):
    clock, pub = FakeClock(), RecordingPublisher()
    old, old_providers = Orchestrator(engine, settings, clock=clock), Providers(settings)
    for i in range(3):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    for _ in range(3):
        drive(old, pub, old_providers, clock)
    res = store_and_ingest(old, "s1", png_bytes(3))  # its agent will wait for a retry
    waiting = res.image["id"]
    pub.publish(res.hints)
    for h in pub.drain():
        if h.lane == "visual":
            handle_hint(old, h.lane, h.task_id, "w", old_providers, pub)
    with engine.begin() as c:  # the agent stage failed once and waits for its retry, a long backoff
        held = c.execute(text("UPDATE tasks SET available_at = :later WHERE image_id = :i AND stage = 'agent'"
                              " AND status = 'queued'"), {"i": waiting, "later": clock().replace(year=2027)})
        assert held.rowcount == 1
    pub.drain()
    assert _visual_models(engine, waiting) == {V1}  # look-alike search finds it today
    assert rows(engine, "SELECT context_status FROM images WHERE id = :i", i=waiting)[0][0] == "pending"

    new_settings = settings.replace(visual_provider=VISUAL_SPEC_B, search_cutover_check_s=0.0)
    new, providers = Orchestrator(engine, new_settings, clock=clock), Providers(new_settings)
    for _ in range(6):  # backfill towards B, the fill runs, the cutover is checked every sweep
        drive(new, pub, providers, clock)
        if _visual_serving(new) == VB:  # whenever the reads switch, nothing searchable may drop out
            assert VB in _visual_models(engine, waiting), "the cutover dropped an image from look-alike search"
    assert _visual_serving(new) == V1
    st = new.search_serving_status("s1", "visual")
    assert st["state"] == "backfill" and st["target"]["coverage"] == {"ready": 3, "total": 4}

    with engine.begin() as c:  # the retry comes due: the agent lands, the job re-plans its visual stage
        c.execute(text("UPDATE tasks SET available_at = :now WHERE image_id = :i AND stage = 'agent'"
                       " AND status = 'queued'"), {"i": waiting, "now": clock()})

    def switched():
        drive(new, pub, providers, clock)
        return _visual_serving(new) == VB

    poll_until(switched, timeout=60, interval=0, what="the visual cutover")
    assert VB in _visual_models(engine, waiting)
    assert new.search_serving_status("s1", "visual")["coverage"] == {"ready": 4, "total": 4}


def test_a_visual_cutover_does_not_wait_for_an_image_that_never_gets_a_visual_vector(engine, settings):
    """An image whose bytes the visual model cannot embed has no visual vector, so nothing to lose;
    a context a human wrote for it must not make the cutover wait for a vector it never gets."""
    clock, pub = FakeClock(), RecordingPublisher()
    poisoned = settings.replace(visual_provider="tests.support.poison:PoisonItemVisual")
    old, old_providers = Orchestrator(engine, poisoned, clock=clock), Providers(poisoned)
    for i in range(3):
        pub.publish(store_and_ingest(old, "s1", png_bytes(i)).hints)
    bad = store_and_ingest(old, "s1", png_bytes(9, size=(POISON_WIDTH, 40)))
    pub.publish(bad.hints)
    for _ in range(3):
        drive(old, pub, old_providers, clock)
    pub.publish(old.edit_context("s1", bad.image["id"], context={"title": "a broken file"}).hints)
    for _ in range(2):
        drive(old, pub, old_providers, clock)
    assert _visual_models(engine, bad.image["id"]) == set()
    assert rows(engine, "SELECT context_status FROM images WHERE id = :i", i=bad.image["id"])[0][0] == "edited"

    new_settings = poisoned.replace(visual_provider=VISUAL_SPEC_B, search_cutover_check_s=0.0)
    new, providers = Orchestrator(engine, new_settings, clock=clock), Providers(new_settings)

    def switched():
        drive(new, pub, providers, clock)
        return _visual_serving(new) == VB

    poll_until(switched, timeout=30, interval=0, what="the visual cutover")
    assert new.search_serving_status("s1", "visual")["coverage"] == {"ready": 3, "total": 3}
