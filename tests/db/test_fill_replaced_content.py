"""A text model change after a content replace whose agent did not finish.

Replacing an image's bytes keeps its old ``metadata_hash`` while the context goes back to
``pending`` until the new version's agent lands. When that agent ends ``unknown_execution`` (a
worker died mid-call and the provider could not tell) or fails, the image has no context for its
current bytes — exactly like an image whose first agent never landed. A text model change must not
treat it as "has a context, lacks the new model": its fill batch would make an explicit job that
calls the paid agent again (for ``unknown_execution`` a silent repeat of a call that may have
happened, SPEC §4.5), and the cutover would wait for it."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import PermanentError
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B, VISUAL_SPEC_B

B = {"text": "deterministic-text-b", "visual": "deterministic-visual-b"}


def _replace(orch: Orchestrator, scope: str, image_id, data: bytes):
    sha = hashlib.sha256(data).hexdigest()
    ns = orch.ensure_scope(scope)
    path = orch.settings.storage_path / f"{ns}/{sha}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return orch.replace_content(scope, image_id, sha256=sha, media_type="image/png", extension=".png",
                                size_bytes=len(data), width=48, height=40, storage_key=f"{ns}/{sha}.png")


@pytest.mark.parametrize(("kind", "ending", "edited"), [
    ("text", "unknown_execution", False), ("text", "failed", False), ("text", "unknown_execution", True),
    ("visual", "unknown_execution", False), ("visual", "unknown_execution", True),
])
def test_a_fill_never_reruns_the_agent_of_a_replaced_image(engine, settings, kind, ending, edited):
    """``edited``: a human edited the context before the replace; it stays ``edited``, but describes
    the old bytes, so the new bytes' job runs the agent — and a fill job would run it again."""
    clock, pub = FakeClock(), RecordingPublisher()
    old, old_providers = Orchestrator(engine, settings, clock=clock), Providers(settings)
    ids = []
    for i in range(3):
        res = store_and_ingest(old, "s1", png_bytes(i))
        pub.publish(res.hints)
        ids.append(res.image["id"])
    for _ in range(3):
        drive(old, pub, old_providers, clock)
    assert rows(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == 3
    replaced = ids[0]
    if edited:
        pub.publish(old.edit_context("s1", replaced, context={"title": "a sleeping kitty"}).hints)
        drive(old, pub, old_providers, clock)
    res = _replace(old, "s1", replaced, png_bytes(50))
    pub.publish(res.hints)
    for h in pub.drain():  # the new bytes' visual stage runs; its agent task is queued
        if h.lane == "visual":
            handle_hint(old, h.lane, h.task_id, "w", old_providers, pub)
    pub.drain()
    [(agent_task,)] = rows(engine, "SELECT id FROM tasks WHERE image_id = :i AND stage = 'agent'"
                                   " AND status = 'queued'", i=replaced)
    claim = old.claim_task(agent_task, "agent-worker", "agent")
    assert claim is not None
    if ending == "unknown_execution":
        old.mark_unknown_execution(claim)  # the call's outcome cannot be proven: a human decides
    else:
        old.fail_task(claim, PermanentError("the provider refused the image"))
    assert rows(engine, "SELECT status FROM processing_jobs WHERE image_id = :i ORDER BY revision DESC LIMIT 1",
                i=replaced)[0][0] == ending
    assert rows(engine, "SELECT context_status, metadata_hash IS NOT NULL FROM images WHERE id = :i",
                i=replaced)[0] == ("edited" if edited else "pending", True)
    pub.publish(old.sweep().hints)  # the scopes' serving states: served by the configured model

    change = {"text_provider": SPEC_B} if kind == "text" else {"visual_provider": VISUAL_SPEC_B}
    new_settings = settings.replace(**change, search_cutover_check_s=0.0)
    new, providers = Orchestrator(engine, new_settings, clock=clock), Providers(new_settings)
    for _ in range(4):
        clock.advance(new_settings.sweep_interval_s + new_settings.rehint_grace_s + 1)
        pub.publish(new.sweep().hints)
        drive(new, pub, providers, clock)

    assert rows(engine, "SELECT count(*) FROM tasks WHERE image_id = :i AND stage = 'agent'", i=replaced)[0][0] == 2, (
        "the model change's fill called the paid agent again")
    assert rows(engine, "SELECT status FROM processing_jobs WHERE image_id = :i ORDER BY revision DESC LIMIT 1",
                i=replaced)[0][0] == ending
    # the images with a context for their bytes were covered, and the scope switched to the new model
    with engine.connect() as c:
        state = c.execute(text("SELECT state, serving_model FROM search_serving WHERE scope_id = 's1'"
                               " AND kind = :k"), {"k": kind}).one()
    assert tuple(state) == ("serving", B[kind])
