"""A text embedding counts only for the ``document_version`` it was rendered with (SPEC §3.3: the
text stage's fingerprint covers it; docs/search.md: "a change of document_version re-makes text
embeddings through the normal validity rules"). An embedding of another rendering of the context
is an artifact of another fingerprint: processing the image again must re-make it (the agent is
not called again), and the re-made row must hold the new rendering."""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.fingerprints import semantic_document
from app.stages.providers import Providers
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest


def _current_text(engine, image_id):
    return rows(engine, "SELECT t.document_version, t.document FROM text_embeddings t JOIN images i"
                        " ON i.id = t.image_id AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash"
                        " WHERE i.id = :i", i=image_id)


def test_a_new_document_version_remakes_the_text_embedding_and_nothing_else(engine, settings):
    assert settings.text_document_version != "1"
    clock, pub = FakeClock(), RecordingPublisher()
    old = Orchestrator(engine, settings, clock=clock)
    res = store_and_ingest(old, "s1", png_bytes(3))
    image_id = res.image["id"]
    pub.publish(res.hints)
    for _ in range(3):
        drive(old, pub, Providers(settings), clock)
    assert old.get_job("s1", res.job["id"])["status"] == "succeeded"
    [(version, _)] = _current_text(engine, image_id)
    assert version == settings.text_document_version

    new_settings = settings.replace(text_document_version="1")
    new = Orchestrator(engine, new_settings, clock=clock)
    result = new.request_processing("s1", image_id)
    assert result.created, "an embedding of another document_version was taken as valid"
    pub.publish(result.hints)
    for _ in range(3):
        drive(new, pub, Providers(new_settings), clock)
    job = new.get_job("s1", result.job["id"])
    assert job["status"] == "succeeded"
    assert [(s["stage"], s["status"]) for s in job["stages"]] == [
        ("visual", "reused"), ("agent", "reused"), ("text_embedding", "succeeded")]
    image = new.get_image("s1", image_id)
    assert _current_text(engine, image_id) == [("1", semantic_document(image["display_name"], image["context"], "1"))]
    assert rows(engine, "SELECT count(*) FROM tasks WHERE image_id = :i AND stage = 'agent'", i=image_id)[0][0] == 1
    # processing it again now finds every stage valid
    again = new.request_processing("s1", image_id)
    assert not again.created and again.job["id"] == result.job["id"]
