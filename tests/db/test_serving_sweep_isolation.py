"""One scope whose serving reconcile raises must not keep the sweep from reconciling the others.

The serving step reconciled its scopes one after the other, text then visual, in one call: a scope
whose action raised at every sweep (a custom operation policy raising for its tenant as its fill
batch is seeded) ended the step there — the scopes behind it never started their backfill, cut over
or refilled, and the visual kind was not reconciled at all (no new scope got its visual serving
row) — at every sweep, since the same scope failed first again."""

from __future__ import annotations

from app.orchestrator import Orchestrator
from app.orchestrator import serving as serving_module
from tests.support.agents import rows
from tests.support.pipeline import png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B


def test_a_scope_whose_reconcile_raises_does_not_keep_the_others_unreconciled(engine, settings, monkeypatch):
    old = Orchestrator(engine, settings)
    for seed, scope in enumerate(("a-poisoned", "b-healthy")):
        store_and_ingest(old, scope, png_bytes(9600 + seed), process=False)
    old.sweep()  # bootstrap: both served by the configured models
    assert rows(engine, "SELECT count(*) FROM search_serving") == [(4,)]
    old.ensure_scope("c-new")  # a new scope: the next sweep gives it its serving rows

    real_start_fill = serving_module._start_fill

    def start_fill(orch_, scope_id, kind, ref):
        if scope_id == "a-poisoned":
            raise RuntimeError("the operation policy raised for this tenant")
        return real_start_fill(orch_, scope_id, kind, ref)

    monkeypatch.setattr(serving_module, "_start_fill", start_fill)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B))
    report = new.sweep()
    assert [f["step"] for f in report.failed_steps] == ["serving"]  # still told (sweep_state, /readyz)
    assert rows(engine, "SELECT state, batch_id IS NOT NULL FROM search_serving"
                        " WHERE scope_id = 'b-healthy' AND kind = 'text'") == [("backfill", True)]
    assert rows(engine, "SELECT kind FROM search_serving WHERE scope_id = 'c-new' ORDER BY kind") == [
        ("text",), ("visual",)]

    report = new.sweep()  # the poisoned scope fails again: told once more, the others unaffected
    assert [f["step"] for f in report.failed_steps] == ["serving"]


def test_a_fill_batch_whose_first_page_raises_is_attached_not_created_again_at_every_sweep(
        engine, settings, monkeypatch):
    """A backfill's fill batch was committed, then its first page seeded, then attached: a first page
    that raised (a custom policy raising for the tenant) left the batch unattached, so every sweep
    created another — one orphan seeding batch per sweep for as long as the policy raised. The batch
    is attached with its creation now; the batch step seeds it (isolated) once the page can be."""
    from app.orchestrator import batches as batches_module
    from tests.support.clock import FakeClock

    clock = FakeClock()
    old = Orchestrator(engine, settings, clock=clock)
    store_and_ingest(old, "a-poisoned", png_bytes(9610), process=False)
    old.sweep()
    real_seed = batches_module._seed_page

    def seed_page(orch_, batch_id, page_size):
        if rows(engine, "SELECT scope_id FROM batches WHERE id = :b", b=batch_id) == [("a-poisoned",)]:
            raise RuntimeError("the operation policy raised for this tenant")
        return real_seed(orch_, batch_id, page_size)

    monkeypatch.setattr(batches_module, "_seed_page", seed_page)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B), clock=clock)
    for _ in range(3):
        clock.advance(settings.sweep_interval_s)
        new.sweep()
    [(batch_id, status)] = rows(engine, "SELECT id, status FROM batches WHERE scope_id = 'a-poisoned'")
    assert status == "seeding"
    assert rows(engine, "SELECT batch_id FROM search_serving WHERE scope_id = 'a-poisoned' AND kind = 'text'") == [
        (batch_id,)]
    monkeypatch.setattr(batches_module, "_seed_page", real_seed)  # the policy answers again
    clock.advance(settings.sweep_interval_s)
    assert not new.sweep().failed_steps
    assert rows(engine, "SELECT status <> 'seeding' FROM batches WHERE id = :b", b=batch_id) == [(True,)]  # seeded
    assert rows(engine, "SELECT count(*) FROM batches WHERE scope_id = 'a-poisoned'") == [(1,)]
