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
