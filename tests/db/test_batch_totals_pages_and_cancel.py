"""Batches at scale (SPEC §4.8, §4.9): progress stays exact when images are deleted midway, the
sweep's seeding step is bounded however many pages a batch has left, and a cancel always finishes."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator import fingerprints as fp
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.agents import rows
from tests.support.pipeline import png_bytes, store_and_ingest


def _run_all(orch, pub, providers):
    for _ in range(30):
        hints = pub.drain()
        if not hints:
            return
        for h in hints:
            if h.task_id is not None:
                handle_hint(orch, h.lane, h.task_id, "w", providers, pub)


def _settle(orch, pub, providers, sweeps=3):
    for _ in range(sweeps):
        _run_all(orch, pub, providers)
        pub.publish(orch.sweep().hints)
        _run_all(orch, pub, providers)


def test_images_deleted_before_their_page_is_seeded_leave_an_exact_completed_batch(engine, settings):
    settings = dataclasses.replace(settings, batch_page_size=2)
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(6)]
    batch, hints = orch.create_batch("s1", all=True, first_page_size=1)  # the API seeds a first page only
    pub.publish(hints)
    assert batch["total"] == 6
    for image_id in ids[-2:]:  # deleted before the sweep seeds their page
        orch.delete_image("s1", image_id)
    _settle(orch, pub, providers)
    done = orch.get_batch("s1", batch["id"])
    assert done["status"] == "completed", done
    assert done["counts"] == {"succeeded": 4} and done["total"] == 4 and done["progress"] == 1.0, done


def test_images_deleted_after_they_were_seeded_leave_an_exact_completed_batch(engine, settings):
    orch = Orchestrator(engine, settings)
    pub, providers = RecordingPublisher(), Providers(settings)
    ids = [store_and_ingest(orch, "s1", png_bytes(i), process=False).image["id"] for i in range(3)]
    batch, hints = orch.create_batch("s1", all=True)
    pub.publish(hints)
    assert orch.get_batch("s1", batch["id"])["status"] == "running"
    orch.delete_image("s1", ids[0])  # its job (and the batch item) cascade away
    _settle(orch, pub, providers)
    done = orch.get_batch("s1", batch["id"])
    assert done["status"] == "completed", done
    assert done["counts"] == {"succeeded": 2} and done["total"] == 2 and done["progress"] == 1.0, done
    orch.delete_image("s1", ids[1])  # after completion: its item goes, the batch stays complete
    after = orch.get_batch("s1", batch["id"])
    assert after["status"] == "completed" and after["counts"] == {"succeeded": 1} and after["progress"] == 1.0, after


def _valid_images(engine, orch, scope: str, n: int) -> None:
    """n image rows (no files) whose every stage is valid already: a batch over them creates no task."""
    cfg = orch.stage_configs
    orch.ensure_scope(scope)
    ctx = {"title": "seeded", "description": "", "ocr_text": "", "tags": []}
    mh = fp.metadata_hash(None, ctx)
    with engine.begin() as c:
        c.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " context, context_status, context_provenance, metadata_hash, created_at, updated_at)"
            " SELECT gen_random_uuid(), :s, encode(sha256((CAST(:s AS varchar) || g::text)::bytea), 'hex'), '.png',"
            " 'image/png', 1, 1, 1, 'none/' || g, CAST(:ctx AS jsonb), 'ready',"
            " jsonb_build_object('image_sha256', encode(sha256((CAST(:s AS varchar) || g::text)::bytea), 'hex'),"
            "  'agent_config_hash', CAST(:ah AS text), 'reverse_image_policy', 'forbid'), :mh,"
            " now() - interval '1 hour' + g * interval '1 microsecond', now() FROM generate_series(1, :n) g"
        ), {"s": scope, "n": n, "ctx": fp.canonical_json(ctx), "ah": cfg.agent_hash, "mh": mh})
        v, t = cfg.visual, cfg.text
        c.execute(text(
            "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
            " embedding) SELECT scope_id, id, sha256, :m, :pv, :d, CAST(array_fill(0.5::real, ARRAY[:d]) AS vector)"
            " FROM images WHERE scope_id = :s"
        ), {"s": scope, "m": v["model"], "pv": v["preprocess_version"], "d": int(v["dims"])})
        c.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
            " document_version, document, embedding) SELECT scope_id, id, sha256, metadata_hash, :m, :d, :dv, 'x',"
            " CAST(array_fill(0.5::real, ARRAY[:d]) AS vector) FROM images WHERE scope_id = :s"
        ), {"s": scope, "m": t["model"], "d": int(t["dims"]), "dv": str(t.get("document_version", "1"))})


def test_one_sweep_seeds_a_bounded_number_of_pages_of_a_batch_with_nothing_to_run(engine, settings):
    """Back-pressure pauses a batch whose jobs queue work; a batch over an already processed library
    queues none, so nothing paused it: one sweep seeded every page (each page one transaction of a
    job decision per image) while every other scope's re-hints waited for the sweep to end."""
    page, n = 10, 400
    settings = dataclasses.replace(settings, batch_page_size=page)
    orch = Orchestrator(engine, settings)
    _valid_images(engine, orch, "big", n)
    batch, hints = orch.create_batch("big", all=True, first_page_size=page)
    assert hints == [] and rows(engine, "SELECT count(*) FROM tasks")[0][0] == 0  # nothing to run
    seeded, _ = orch.continue_batches()
    assert 0 < seeded < n - page, seeded  # bounded: the next sweeps go on
    for _ in range(n // page):  # the next runs go on to the end
        if orch.get_batch("big", batch["id"])["status"] != "seeding":
            break
        orch.continue_batches()
    done = orch.get_batch("big", batch["id"])
    assert done["status"] == "running" or done["status"] == "completed"
    assert rows(engine, "SELECT count(*) FROM batch_items")[0][0] == n


def test_a_cancel_interrupted_after_the_batch_was_marked_can_be_finished_by_cancelling_again(engine, settings):
    """cancel_batch commits the batch's ``cancelled`` first, then cancels its active jobs one
    transaction each (thousands for a big batch, inside the HTTP request). A request killed in
    between (gunicorn's timeout, a restart) left those jobs running, and cancelling again answered
    "finished, unchanged" without touching them: nothing could stop them any more."""
    from app.orchestrator.store import batches as store

    orch = Orchestrator(engine, settings)
    for i in range(3):
        store_and_ingest(orch, "s1", png_bytes(i), process=False)
    batch, _ = orch.create_batch("s1", all=True)
    assert sum(batch["counts"].values()) == 3 and batch["counts"].get("cancelled") is None
    with engine.begin() as conn:  # the request's first transaction committed, then the process died
        store.cancel_batch_txn(conn, batch["id"], orch.now()).expect("running")
    again = orch.cancel_batch("s1", batch["id"])
    assert again["status"] == "cancelled" and again["counts"] == {"cancelled": 3}, again
    assert rows(engine, "SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')")[0][0] == 0


def test_a_cancel_interrupted_after_the_batch_was_marked_is_finished_by_the_sweep(engine, settings):
    """The same interrupted cancel, and nobody cancels again (the client saw its request fail and
    the batch already says ``cancelled``): the batch's jobs must not run on for good. The mark keeps
    the batch's progress open, so the sweep finishes the cancel before it tells the counts."""
    from app.orchestrator.store import batches as store

    orch = Orchestrator(engine, settings)
    for i in range(3):
        store_and_ingest(orch, "s1", png_bytes(i), process=False)
    batch, _ = orch.create_batch("s1", all=True)
    with engine.begin() as conn:  # the request's first transaction committed, then the process died
        store.cancel_batch_txn(conn, batch["id"], orch.now()).expect("running")
    orch.sweep()
    done = orch.get_batch("s1", batch["id"])
    assert done["status"] == "cancelled" and done["counts"] == {"cancelled": 3}, done
    assert rows(engine, "SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')")[0][0] == 0
    assert rows(engine, "SELECT progress_open FROM batches")[0][0] is False
