"""Changing the text model without a search outage (issue 18 part 2), through the orchestrator with
in-process workers: backfill, dual writes, one cutover per scope, early cutover, rollback, retarget."""

from __future__ import annotations

import threading

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.search.service import search_text
from app.search.serving import text_source
from app.stages.providers import Providers
from tests.conftest import poll_until
from tests.support.pipeline import Workers, png_bytes, store_and_ingest
from tests.support.textmodels import SPEC_B, SPEC_C

A, B, C = "deterministic-text-v1", "deterministic-text-b", "deterministic-text-c"


def _search(orch: Orchestrator, scope: str, q: str = "still image") -> dict:
    source = text_source(orch.engine, scope, Providers(orch.settings).text, orch.settings)
    return {**search_text(orch.engine, source.provider, scope, q, limit=50, mode="semantic"), "serving": source.info}


def _sweep(orch: Orchestrator, pub: RecordingPublisher) -> None:
    report = orch.sweep()
    pub.publish(report.hints)


def _rows(engine, sql: str, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).all()


def _current_models(engine, scope: str) -> dict[str, set[str]]:
    rows = _rows(engine, "SELECT i.id::text, t.model FROM images i JOIN text_embeddings t ON t.image_id = i.id"
                 " AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash WHERE i.scope_id = :s", s=scope)
    out: dict[str, set[str]] = {}
    for iid, model in rows:
        out.setdefault(iid, set()).add(model)
    return out


def _events(engine, scope: str) -> list[tuple[str, int]]:
    return [(a, e) for a, e in _rows(engine, "SELECT action, epoch FROM search_serving_events WHERE scope_id = :s"
                                      " AND kind = 'text' ORDER BY id", s=scope)]


def _processed(orch, pub, scope: str, n: int, seed0: int = 0) -> list[str]:
    ids = []
    with Workers(orch, pub, n=2):
        for i in range(n):
            res = store_and_ingest(orch, scope, png_bytes(seed0 + i))
            pub.publish(res.hints)
            ids.append(res.image["id"])
        poll_until(lambda: _rows(orch.engine, "SELECT count(*) FROM processing_jobs WHERE scope_id = :s"
                                 " AND status = 'succeeded'", s=scope)[0][0] >= n, timeout=60, what="processed")
    return ids


def test_model_change_backfills_dual_writes_cuts_over_once_and_rolls_back(engine, settings):
    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    ids = _processed(old, pub, "s1", 6)
    _sweep(old, pub)  # bootstrap: served by the configured model
    before = _search(old, "s1")
    assert before["serving"]["model"] == A and before["serving"]["state"] == "serving"
    assert len(before["items"]) == 6

    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_cutover_check_s=0.0))
    _sweep(new, pub)  # the configured model changed: backfill towards B, fill batch attached
    during = _search(new, "s1")
    assert during["serving"]["state"] == "backfill" and during["serving"]["model"] == A
    assert during["model"] == A and len(during["items"]) == 6
    assert [h["image"]["id"] for h in during["items"]] == [h["image"]["id"] for h in before["items"]]

    with Workers(new, pub, n=2):
        added = store_and_ingest(new, "s1", png_bytes(100))  # an upload during the backfill
        pub.publish(added.hints)
        edited = new.edit_context("s1", ids[0], context={"title": "a sleeping kitty"})
        pub.publish(edited.hints)

        def switched():
            _sweep(new, pub)
            assert _search(new, "s1")["items"], "search went empty during the backfill"
            return _search(new, "s1")["serving"]["model"] == B

        poll_until(switched, timeout=90, interval=0.1, what="cutover to B")
    models = _current_models(engine, "s1")
    # the upload and the context edit were embedded with both models — unless their text stage ran
    # after the cutover (the cutover waits only for images with a finished context), then with B only
    cut_at = _rows(engine, "SELECT at FROM search_serving_events WHERE scope_id = 's1' AND kind = 'text'"
                           " AND action = 'cutover'")[0][0]
    for image_id in (added.image["id"], ids[0]):
        made_at = _rows(engine, "SELECT t.created_at FROM text_embeddings t JOIN images i ON i.id = t.image_id"
                                " AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash"
                                " WHERE i.id = :i AND t.model = :m", i=image_id, m=B)[0][0]
        assert models[image_id] == ({A, B} if made_at < cut_at else {B}), (image_id, made_at, cut_at)
    assert all(ms >= {B} for ms in models.values()) and len(models) == 7
    assert _events(engine, "s1") == [("bootstrap", 0), ("backfill", 0), ("cutover", 1)]
    after = _search(new, "s1")
    assert after["serving"] == {**after["serving"], "state": "serving", "epoch": 1, "model": B}
    assert after["model"] == B and len(after["items"]) == 7

    status, _ = new.search_rollback("s1")
    assert (status["state"], status["epoch"], status["model"]) == ("pinned", 2, A)
    back = _search(new, "s1")
    assert back["model"] == A and back["serving"]["epoch"] == 2
    assert {h["image"]["id"] for h in back["items"]} == {h["image"]["id"] for h in after["items"]}
    _sweep(new, pub)  # pinned: no new backfill although B is configured
    assert new.search_serving_status("s1")["state"] == "pinned"
    new.search_resume("s1")
    _sweep(new, pub)
    assert new.search_serving_status("s1")["state"] == "backfill"


def test_racing_cutover_attempts_switch_exactly_once(engine, settings):
    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    _processed(old, pub, "s1", 4)
    _sweep(old, pub)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_cutover_check_s=0.0))
    # fill B by hand-driven workers but keep the sweep from cutting over: drive the fill batch only
    _sweep_until_filled(new, pub, "s1")
    barrier = threading.Barrier(8)
    won: list[bool] = []

    def race():
        barrier.wait()
        won.append(new.try_cutover("s1", force_check=True))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) <= 1
    assert [a for a, _ in _events(engine, "s1")].count("cutover") == 1
    assert new.search_serving_status("s1")["epoch"] == 1


def _sweep_until_filled(orch, pub, scope):
    """Run the backfill's fill batch with in-process workers while cutover checks are throttled away."""
    slow = Orchestrator(orch.engine, orch.settings.replace(search_cutover_check_s=3600.0))
    _sweep(slow, pub)
    with Workers(slow, pub, n=2):
        def filled():
            _sweep(slow, pub)
            cov = slow.search_serving_status(scope)
            return cov["target"] and cov["target"]["coverage"]["ready"] == cov["target"]["coverage"]["total"]

        poll_until(filled, timeout=60, interval=0.1, what="target filled")
    with orch.engine.begin() as c:  # the throttled checks may have run once already: allow the racers now
        c.execute(text("UPDATE search_serving SET checked_at = NULL WHERE scope_id = :s"), {"s": scope})


def test_configuration_changing_again_retargets_then_aborts(engine, settings):
    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    _processed(old, pub, "s1", 3)
    _sweep(old, pub)
    to_b = Orchestrator(engine, settings.replace(text_provider=SPEC_B))
    _sweep(to_b, pub)
    assert to_b.search_serving_status("s1")["target"]["model"] == B
    to_c = Orchestrator(engine, settings.replace(text_provider=SPEC_C))
    _sweep(to_c, pub)
    st = to_c.search_serving_status("s1")
    assert (st["state"], st["model"], st["target"]["model"]) == ("backfill", A, C)
    _sweep(old, pub)  # back to the serving model: the backfill is abandoned, nothing switched
    st = old.search_serving_status("s1")
    assert (st["state"], st["model"], st["target"], st["epoch"]) == ("serving", A, None, 0)
    assert [a for a, _ in _events(engine, "s1")] == ["bootstrap", "backfill", "retarget", "abort"]
    assert _rows(engine, "SELECT count(*) FROM batches WHERE status NOT IN ('cancelled', 'completed')")[0][0] == 0


def test_early_cutover_serves_the_target_and_old_rows_become_prunable(engine, settings):
    from datetime import timedelta

    from app.orchestrator import serving_reads as serving
    from app.orchestrator.store import serving_fill as q

    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    _processed(old, pub, "s1", 3)
    _sweep(old, pub)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, search_cutover_check_s=3600.0))
    _sweep(new, pub)
    with engine.connect() as c:
        assert q.prunable_text_embeddings_txn(c, new.now() + timedelta(days=1), 100) == []
    st = new.search_cutover("s1")
    assert (st["state"], st["epoch"], st["model"], st["previous"]["model"]) == ("serving", 1, B, A)
    res = _search(new, "s1")
    assert res["model"] == B and res["items"] == []  # nothing of B yet: honest, and lexical still answers
    assert _search(new, "s1")["coverage"]["ready"] == 0
    with engine.connect() as c:
        assert q.prunable_text_embeddings_txn(c, new.now() - timedelta(days=1), 100) == []  # rollback window
        assert len(q.prunable_text_embeddings_txn(c, new.now() + timedelta(days=1), 100)) == 3
        assert serving.superseded_text_embeddings_txn(new, c, 100) == []  # the hook keeps the window
        late = Orchestrator(engine, new.settings.replace(search_rollback_window_s=0.0))
        assert len(serving.superseded_text_embeddings_txn(late, c, 100)) == 3
    new.search_rollback("s1")  # pinned on A: B (previous, and configured) is kept whatever the window
    with engine.connect() as c:
        assert q.prunable_text_embeddings_txn(c, new.now() + timedelta(days=1), 100) == []


def test_visual_model_change_backfills_dual_writes_and_cuts_over(engine, settings):
    from app.api import search_queries as VQ
    from app.search.serving import visual_source
    from tests.support.textmodels import VISUAL_SPEC_B

    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    ids = _processed(old, pub, "s1", 4)
    _sweep(old, pub)

    def look_alike(orch):
        src = visual_source(engine, "s1", Providers(orch.settings).visual, orch.settings)
        vector = VQ.current_visual_vector(engine, "s1", ids[0], model=src.model,
                                          preprocess_version=src.preprocess_version, dims=src.dims)
        hits = VQ.search_visual(engine, "s1", model=src.model, preprocess_version=src.preprocess_version,
                                dims=src.dims, vector=vector, limit=10, exclude_image_id=ids[0])
        return src, hits

    src, hits = look_alike(old)
    assert src.model == "deterministic-v1" and len(hits) == 3
    new = Orchestrator(engine, settings.replace(visual_provider=VISUAL_SPEC_B, search_cutover_check_s=0.0))
    _sweep(new, pub)
    src, hits = look_alike(new)
    assert (src.model, src.info["state"], src.info["target"]["model"]) == ("deterministic-v1", "backfill",
                                                                           "deterministic-visual-b")
    assert len(hits) == 3  # the API configured with B still answers from the old visual model
    text_before = _rows(engine, "SELECT count(*) FROM text_embeddings")[0][0]
    with Workers(new, pub, n=2):
        added = store_and_ingest(new, "s1", png_bytes(200))
        pub.publish(added.hints)

        def switched():
            _sweep(new, pub)
            assert look_alike(new)[1], "visual search went empty during the backfill"
            return look_alike(new)[0].model == "deterministic-visual-b"

        poll_until(switched, timeout=60, interval=0.1, what="visual cutover")
    rows = _rows(engine, "SELECT image_id::text, model FROM visual_embeddings")
    by_image: dict[str, set[str]] = {}
    for iid, model in rows:
        by_image.setdefault(iid, set()).add(model)
    assert by_image[added.image["id"]] == {"deterministic-v1", "deterministic-visual-b"}  # the upload: both
    assert all("deterministic-visual-b" in m for m in by_image.values()) and len(by_image) == 5
    assert _rows(engine, "SELECT count(*) FROM text_embeddings")[0][0] == text_before + 1  # the fill ran visual only
    events = _rows(engine, "SELECT action, epoch FROM search_serving_events WHERE kind = 'visual' ORDER BY id")
    assert [tuple(e) for e in events] == [("bootstrap", 0), ("backfill", 0), ("cutover", 1)]
    assert new.search_serving_status("s1")["model"] == A  # the text search was never touched
    assert len(look_alike(new)[1]) == 4
    st, _ = new.search_rollback("s1", "visual")
    assert (st["kind"], st["model"], st["epoch"]) == ("visual", "deterministic-v1", 2)
    assert look_alike(new)[0].model == "deterministic-v1" and len(look_alike(new)[1]) == 4


def test_fill_batch_seeds_only_what_the_new_model_lacks_with_back_pressure(engine, settings):
    from app.orchestrator.batches import get_batch

    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    _processed(old, pub, "s1", 5)
    store_and_ingest(old, "s1", png_bytes(77), process=False)  # no context yet: no text to wait for
    _sweep(old, pub)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B, batch_page_size=2, batch_backlog_threshold=1,
                                                search_cutover_check_s=0.0))
    new.sweep()  # backfill starts; the fill batch seeds its first item (hints dropped: no worker yet)
    new.sweep()  # one more page, then back-pressure: the scope's queued backlog is above the threshold
    new.sweep()
    batch_id = new.search_serving_status("s1")["target"]["batch_id"]
    batch = get_batch(new, "s1", batch_id)
    assert batch["status"] == "seeding" and batch["total"] == 5 and sum(batch["counts"].values()) == 3
    with Workers(new, pub, n=2):
        def done():
            report = new.sweep()
            pub.publish(report.hints)
            return new.search_serving_status("s1")["model"] == B

        poll_until(done, timeout=60, interval=0.1, what="fill resumed and cut over")
    batch = get_batch(new, "s1", batch_id)
    assert batch["total"] == 5 and batch["counts"] == {"succeeded": 5}
    assert _rows(engine, "SELECT count(*) FROM processing_jobs WHERE batch_id = :b", b=batch_id)[0][0] == 5


def test_a_gap_the_fill_cannot_close_is_refilled_then_waits_for_an_early_cutover(engine, settings):
    from tests.support.textmodels import SPEC_B_POISONED

    pub = RecordingPublisher()
    old = Orchestrator(engine, settings)
    ids = _processed(old, pub, "s1", 3)
    with Workers(old, pub, n=1):
        res = old.edit_context("s1", ids[0], context={"title": "poison pill"})
        pub.publish(res.hints)
        poll_until(lambda: _rows(engine, "SELECT count(*) FROM text_embeddings WHERE model = :m", m=A)[0][0] == 4,
                   timeout=30, what="edit embedded with A")
    _sweep(old, pub)
    new = Orchestrator(engine, settings.replace(text_provider=SPEC_B_POISONED, search_cutover_check_s=0.0,
                                                max_attempts=1, search_fill_rounds=2))
    with Workers(new, pub, n=2):
        def rounds_spent():
            _sweep(new, pub)
            st = new.search_serving_status("s1")
            batch = st["target"] and st["target"]["batch_id"]
            done = batch and new.get_batch("s1", batch)["status"] == "completed"
            return st["target"]["fill_rounds"] == 2 and done and st

        st = poll_until(rounds_spent, timeout=60, interval=0.1, what="two fill rounds")
        for _ in range(3):  # no third round: the scope waits for an operator
            _sweep(new, pub)
    st = new.search_serving_status("s1")
    assert (st["state"], st["model"], st["target"]["fill_rounds"]) == ("backfill", A, 2)
    assert st["target"]["coverage"] == {"ready": 2, "total": 3}
    assert [a for a, _ in _events(engine, "s1")] == ["bootstrap", "backfill", "refill"]
    assert len(_search(new, "s1")["items"]) == 3  # still served by A, the poisoned image included
    st = new.search_cutover("s1")
    assert (st["state"], st["model"], st["epoch"]) == ("serving", B, 1)
    assert len(_search(new, "s1")["items"]) == 2  # B lacks the poisoned image: found by its words only
