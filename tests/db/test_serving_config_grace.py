"""A model change rolled out one process at a time (docs/operations.md "Changing the text model"):
old- and new-configuration workers both take sweeps for a while. A sweep acts on a disagreement
between its configured model and a scope's serving state (begin a backfill, abort, retarget) only
once sweeps have disagreed so for ``MEMEFLOW_SEARCH_CONFIG_GRACE_S`` with no sweep agreeing in
between, so the two configurations never undo each other; once every process runs one
configuration, it wins after the grace. And the sweep's round-robin over scopes reaches every scope
(migration 0025)."""

from __future__ import annotations

import json
import threading
from datetime import datetime

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator import serving as serving_step
from app.orchestrator.serving_reads import configured_ref
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B, SPEC_C

A, B = "deterministic-text-v1", "deterministic-text-b"
GRACE = 60.0
TICK = 15.0  # the default sweep interval
TICKS_PER_GRACE = int(GRACE // TICK)


def _rows(engine, sql: str, **params) -> list:
    with engine.connect() as c:
        return c.execute(text(sql), params).all()


def _state(engine, scope: str = "s1") -> tuple:
    [row] = _rows(engine, "SELECT state, serving_model, target_model FROM search_serving WHERE scope_id = :s"
                  " AND kind = 'text'", s=scope)
    return tuple(row)


def _events(engine, scope: str = "s1") -> list[str]:
    return [a for (a,) in _rows(engine, "SELECT action FROM search_serving_events WHERE scope_id = :s"
                                " AND kind = 'text' ORDER BY id", s=scope)]


class Rollout:
    """An old (model A) and a new (model B) configuration sharing one database and one fake clock;
    the workers that run jobs are the new configuration's (the sweeps are what is under test)."""

    def __init__(self, engine, settings) -> None:
        self.clock = FakeClock()
        self.engine = engine
        self.old = Orchestrator(engine, settings.replace(search_config_grace_s=GRACE), clock=self.clock)
        self.new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_config_grace_s=GRACE,
                                                         search_cutover_check_s=0.0), clock=self.clock)
        self.providers = {id(self.old): Providers(self.old.settings), id(self.new): Providers(self.new.settings)}
        self.pub = RecordingPublisher()

    def work(self, orch: Orchestrator) -> None:
        """Run every published hint (and the hints they publish) with ``orch``'s workers."""
        for _ in range(500):
            hints = self.pub.drain()
            if not hints:
                return
            for h in hints:
                handle_hint(orch, h.lane, h.task_id, "worker", self.providers[id(orch)], self.pub)
        raise AssertionError("hints kept coming")

    def tick(self, orch: Orchestrator) -> None:
        """One sweep interval passes; ``orch``'s configuration takes the sweep; new workers run its hints."""
        self.clock.advance(TICK)
        self.pub.publish(orch.sweep().hints)
        self.work(self.new)

    def sweep_only(self, orch: Orchestrator) -> None:
        """One sweep interval passes and ``orch``'s configuration sweeps; no worker runs anything."""
        self.clock.advance(TICK)
        orch.sweep()

    def processed_under_old(self, n: int) -> None:
        for i in range(n):
            self.pub.publish(store_and_ingest(self.old, "s1", png_bytes(i)).hints)
        self.work(self.old)
        self.tick(self.old)  # bootstrap: served by A
        assert _state(self.engine) == ("serving", A, None)

    def alternate(self, ticks: int, *, until=None) -> bool:
        """Old and new sweeps take turns for ``ticks`` intervals (or until ``until()`` holds)."""
        for i in range(ticks):
            self.tick(self.new if i % 2 == 0 else self.old)
            if until is not None and until():
                return True
        return until is None

    def only(self, orch: Orchestrator, ticks: int, *, until) -> int:
        """Only ``orch``'s configuration sweeps, until ``until()`` holds; how many ticks it took."""
        for i in range(1, ticks + 1):
            self.tick(orch)
            if until():
                return i
        raise AssertionError(f"not reached in {ticks} sweeps")


def test_alternating_old_and_new_sweeps_never_abort_the_backfill_nor_switch_back(engine, settings):
    r = Rollout(engine, settings)
    r.processed_under_old(3)
    # the rollout's first half: both configurations sweep in turn, for several graces — nothing moves
    r.alternate(4 * TICKS_PER_GRACE)
    assert _state(engine) == ("serving", A, None) and _events(engine) == ["bootstrap"]
    # the new configuration alone for a grace: the backfill towards B begins
    r.only(r.new, 2 * TICKS_PER_GRACE, until=lambda: _state(engine)[0] == "backfill")
    # an old process still takes sweeps (a late restart): the backfill goes on, cuts over, stays on B
    assert r.alternate(10 * TICKS_PER_GRACE, until=lambda: _state(engine) == ("serving", B, None))
    r.alternate(4 * TICKS_PER_GRACE)
    assert _state(engine) == ("serving", B, None)
    assert _events(engine) == ["bootstrap", "backfill", "cutover"]
    assert _rows(engine, "SELECT count(*) FROM batches WHERE status = 'cancelled'")[0][0] == 0


def test_once_only_the_new_configuration_sweeps_the_change_cuts_over_as_before(engine, settings):
    r = Rollout(engine, settings)
    r.processed_under_old(3)
    r.alternate(2 * TICKS_PER_GRACE)
    last_old_sweep = r.clock()
    ticks = r.only(r.new, 20 * TICKS_PER_GRACE, until=lambda: _state(engine) == ("serving", B, None))
    assert ticks > TICKS_PER_GRACE  # the grace counted from the last disagreeing (old) sweep
    [(started, epoch)] = _rows(engine, "SELECT started_at, epoch FROM search_serving WHERE scope_id = 's1'"
                               " AND kind = 'text'")
    assert (started - last_old_sweep).total_seconds() >= GRACE and epoch == 1
    assert _events(engine) == ["bootstrap", "backfill", "cutover"]
    missing_b = _rows(engine, "SELECT count(*) FROM images i WHERE i.scope_id = 's1' AND NOT EXISTS (SELECT 1"
                      " FROM text_embeddings t WHERE t.image_id = i.id AND t.image_sha256 = i.sha256"
                      " AND t.metadata_hash = i.metadata_hash AND t.model = :m)", m=B)[0][0]
    assert missing_b == 0


def test_a_real_revert_aborts_the_backfill_after_the_grace(engine, settings):
    r = Rollout(engine, settings)
    r.processed_under_old(2)
    for _ in range(2 * TICKS_PER_GRACE):  # no fill job runs: the backfill stays uncovered
        r.sweep_only(r.new)
    assert _state(engine) == ("backfill", A, B)
    [batch] = _rows(engine, "SELECT batch_id FROM search_serving WHERE scope_id = 's1' AND kind = 'text'")[0]
    reverted_at = r.clock()
    while (r.clock() - reverted_at).total_seconds() + TICK < GRACE:  # every process back on A, within the grace
        r.sweep_only(r.old)
        assert _state(engine) == ("backfill", A, B)
    for _ in range(2):
        r.sweep_only(r.old)
    assert _state(engine) == ("serving", A, None)
    assert _events(engine) == ["bootstrap", "backfill", "abort"]
    assert _rows(engine, "SELECT status FROM batches WHERE id = :b", b=batch)[0][0] == "cancelled"


def test_a_revert_after_the_cutover_switches_back_only_after_the_grace(engine, settings):
    r = Rollout(engine, settings)
    r.processed_under_old(2)
    r.only(r.new, 20 * TICKS_PER_GRACE, until=lambda: _state(engine) == ("serving", B, None))
    for _ in range(TICKS_PER_GRACE - 1):  # every process back on A, within the grace: still B
        r.sweep_only(r.old)
        assert _state(engine) == ("serving", B, None)
    for _ in range(2):
        r.sweep_only(r.old)
    assert _state(engine) == ("backfill", B, A)
    assert _events(engine) == ["bootstrap", "backfill", "cutover", "backfill"]


def test_a_lone_sweep_begins_a_backfill_only_after_the_grace(engine, settings):
    clock = FakeClock()
    old = Orchestrator(engine, settings.replace(search_config_grace_s=GRACE), clock=clock)
    to_b = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_config_grace_s=GRACE), clock=clock)
    to_c = Orchestrator(engine, settings.replace(text_provider=SPEC_C, search_config_grace_s=GRACE), clock=clock)
    old.ensure_scope("s1")
    old.reconcile_serving()
    to_b.reconcile_serving()  # the disagreement is noted, not acted on
    assert _state(engine) == ("serving", A, None)
    pending = old.search_serving_status("s1")["pending_change"]  # shown to operators (API, CLI)
    assert pending["model"] == B and datetime.fromisoformat(pending["since"]) == clock()
    clock.advance(GRACE / 2)
    to_c.reconcile_serving()  # towards another model: the clock starts again
    clock.advance(GRACE / 2)
    to_b.reconcile_serving()  # towards B again: starts again too
    assert _state(engine) == ("serving", A, None)
    clock.advance(GRACE - 1)
    to_b.reconcile_serving()
    assert _state(engine) == ("serving", A, None)
    clock.advance(1)
    counts, _ = to_b.reconcile_serving()
    assert counts["backfills_started"] == 1 and _state(engine) == ("backfill", A, B)
    assert _events(engine) == ["bootstrap", "backfill"]
    [mark] = _rows(engine, "SELECT config_disagree_since FROM search_serving WHERE scope_id = 's1' AND kind = 'text'")
    assert mark == (None,)  # a change of direction clears it
    assert old.search_serving_status("s1")["pending_change"] is None


def test_racing_sweeps_of_both_configurations_act_at_most_once(engine, settings):
    """When the new configuration's disagreement is due, old and new sweeps race: either an old one
    clears it first (nothing begins) or one new one begins the backfill — never twice, never an
    abort, never a switch back (an old sweep's disagreement starts its own grace)."""
    clock = FakeClock()
    old = Orchestrator(engine, settings.replace(search_config_grace_s=GRACE), clock=clock)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_config_grace_s=GRACE), clock=clock)
    old.ensure_scope("s1")
    old.reconcile_serving()
    new.reconcile_serving()
    clock.advance(GRACE)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def sweep(orch):
        barrier.wait()
        try:
            orch.reconcile_serving()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=sweep, args=(new if i % 2 else old,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # (the scope has no image: a new sweep that finds the backfill begun may cut it over at once)
    assert _events(engine) in (["bootstrap"], ["bootstrap", "backfill"], ["bootstrap", "backfill", "cutover"])


def test_every_scope_gets_the_sweeps_attention_when_more_need_it_than_one_sweep_takes(engine, settings, monkeypatch):
    """Scopes whose fill batch is still seeding are looked at without being checked; they must not
    take every turn from scopes waiting for their backfill to begin."""
    monkeypatch.setattr(serving_step, "SWEEP_SCOPES", 3)
    old = Orchestrator(engine, settings)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B))
    seeding, waiting = [f"seeding-{i}" for i in range(6)], [f"waiting-{i}" for i in range(3)]
    for scope in seeding + waiting:
        old.ensure_scope(scope)
    for _ in range(3):  # serving rows for all nine, three a sweep
        old.reconcile_serving()
    ref = configured_ref(new, "text")
    with engine.begin() as c:  # older backfills towards B whose fill batch is still seeding
        for scope in seeding:
            c.execute(text(
                "WITH b AS (INSERT INTO batches (id, scope_id, status, select_all, reverse_image_policy)"
                " VALUES (gen_random_uuid(), :s, 'seeding', true, 'forbid') RETURNING id)"
                " UPDATE search_serving SET state = 'backfill', target_model = :m, target_dims = :d,"
                " target_ref = CAST(:ref AS jsonb), batch_id = (SELECT id FROM b),"
                " updated_at = now() - interval '1 hour' WHERE scope_id = :s AND kind = 'text'"
            ), {"s": scope, "m": ref["model"], "d": ref["dims"], "ref": json.dumps(ref)})
    for _ in range(3):  # nine scopes need attention, three a sweep
        new.reconcile_serving()
    assert {s: _state(engine, s)[0] for s in waiting} == dict.fromkeys(waiting, "backfill")
    assert _rows(engine, "SELECT count(*) FROM search_serving WHERE kind = 'text' AND attended_at IS NULL")[0][0] == 0
