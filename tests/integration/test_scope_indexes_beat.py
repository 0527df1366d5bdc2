"""A deployment of one lane worker and beat keeps the per-scope HNSW indexes with nothing else to
run: beat's memeflow.search_indexes (maintenance queue) builds the index of a scope that crossed
the threshold, and drops it once the scope is gone (app/orchestrator/scope_indexes.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.db.engine import scope_vector_index_name
from app.orchestrator import Orchestrator
from app.orchestrator.scope_indexes import existing
from tests.conftest import poll_until

pytestmark = pytest.mark.slow


def _scope(engine, scope: str, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, gen_random_uuid())"), {"s": scope})
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT gen_random_uuid(), CAST(:s AS text), md5(:s || g) || md5(:s || g || 'x'), '.png',"
            " 'image/png', 1, 1, 1, 'k', 'h' FROM generate_series(1, :n) g"), {"s": scope, "n": n})


def test_beat_and_a_lane_worker_build_and_drop_scope_indexes(cluster, engine, it_settings):
    cluster.extra_env.update(MEMEFLOW_SEARCH_INDEX_INTERVAL_S="1", MEMEFLOW_SEARCH_INDEX_MIN_IMAGES="20")
    cfg = Orchestrator(engine, it_settings).stage_configs
    name = scope_vector_index_name("text_embeddings", str(cfg.text["model"]), int(cfg.text["dims"]), "grown")
    visual = scope_vector_index_name("visual_embeddings", str(cfg.visual["model"]), int(cfg.visual["dims"]), "grown")
    _scope(engine, "big", 100)  # over half of all images: none
    _scope(engine, "grown", 10)
    cluster.worker("embedding")
    cluster.beat()
    _scope(engine, "small", 5)
    with engine.begin() as conn:  # "grown" crosses the threshold
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT gen_random_uuid(), 'grown', md5('g2' || g) || md5('g2x' || g), '.png',"
            " 'image/png', 1, 1, 1, 'k', 'h' FROM generate_series(1, 30) g"))
    poll_until(lambda: existing(engine).get(name) and existing(engine).get(visual), timeout=120, interval=0.2,
               what="beat's maintenance built grown's scope indexes")
    assert set(existing(engine)) == {name, visual}  # none for "big" (over half) or "small" (below)
    with engine.begin() as conn:  # the scope goes
        conn.execute(text("DELETE FROM images WHERE scope_id = 'grown'"))
        conn.execute(text("DELETE FROM scope_usage WHERE scope_id = 'grown'"))
        conn.execute(text("DELETE FROM search_serving WHERE scope_id = 'grown'"))
        conn.execute(text("DELETE FROM scopes WHERE id = 'grown'"))
    poll_until(lambda: not existing(engine), timeout=120, interval=0.2, what="the deleted scope's indexes dropped")
