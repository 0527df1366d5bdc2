"""Search in a shared index: a small scope gets exactly its nearest images, a large one uses the
HNSW index (bench/search_scale.py measures the same at 1M rows; docs/performance.md)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sqlalchemy import event, text

from app.api import search_queries as VQ
from app.db.engine import ensure_vector_index, scope_vector_index_name
from app.orchestrator.scope_indexes import ensure_scope_vector_indexes
from app.search import queries as Q
from app.search import service
from app.search.queries import vector_literal

DIMS = 16
SIZES = {"big": 24_000, "mid": 700, "small": 40}  # one index: 97% / 3% / 0.2% of its rows


class GivenVector:
    def __init__(self) -> None:
        self.vector: list[float] = [0.0] * DIMS

    def config(self) -> dict:
        return {"model": "tm", "dims": DIMS}

    def embed_query(self, texts: list[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


@pytest.fixture()
def shared_index(engine):
    """Three scopes of skewed sizes; every image with a current text and visual embedding (random
    unit vectors) and a stale text one (an older metadata_hash, nearest to nothing in particular)."""
    with engine.begin() as conn:
        lo = 0
        for scope, n in SIZES.items():
            conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, gen_random_uuid())"), {"s": scope})
            conn.execute(text(
                "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
                " metadata_hash) SELECT md5('i' || g)::uuid, :s, md5(g::text) || md5((g + 1)::text), '.png',"
                " 'image/png', 1, 1, 1, 'k', 'h2' FROM generate_series(:lo, :hi - 1) g"), {"s": scope, "lo": lo,
                                                                                        "hi": lo + n})
            lo += n
        conn.execute(text("SELECT setseed(0.18)"))
        vec = f"l2_normalize(ARRAY(SELECT random() - 0.5 FROM generate_series(1, {DIMS}) WHERE i.id IS NOT NULL)::vector)"
        for mh in ("h1", "h2"):
            conn.execute(text(
                "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
                f" document_version, document, embedding) SELECT scope_id, id, sha256, :mh, 'tm', {DIMS}, '1', '', {vec}"
                " FROM images i ORDER BY random()"), {"mh": mh})
        conn.execute(text(
            "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims, embedding)"
            f" SELECT scope_id, id, sha256, 'vm', 'p', {DIMS}, {vec} FROM images i ORDER BY random()"))
        ensure_vector_index(conn, "text_embeddings", "tm", DIMS)
        ensure_vector_index(conn, "visual_embeddings", "vm", DIMS)
        conn.execute(text("ANALYZE"))
    return engine


def _exact(engine, table: str, scope: str, q: list[float], k: int) -> list[str]:
    current = "AND e.metadata_hash = i.metadata_hash" if table == "text_embeddings" else ""
    with engine.connect() as conn:
        rows = conn.execute(text(
            f"SELECT e.image_id::text, e.embedding::vector({DIMS}) <=> CAST(:q AS vector({DIMS})) AS d FROM {table} e"
            f" JOIN images i ON i.scope_id = e.scope_id AND i.id = e.image_id AND i.sha256 = e.image_sha256 {current}"
            " WHERE e.scope_id = :s"), {"q": vector_literal(q), "s": scope}).all()
    return [r[0] for r in sorted(rows, key=lambda r: (r[1], r[0]))[:k]]


def _queries(n: int) -> list[list[float]]:
    v = np.random.default_rng(5).normal(size=(n, DIMS))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()


@pytest.mark.parametrize("scope", ["mid", "small"])
def test_a_small_scope_gets_exactly_its_nearest_images(shared_index, scope):
    """Semantic and visual search of a scope of 0.2–3% of the index return the exact answer (the
    whole ranked list, ties by id) — a filtered HNSW scan of the shared index does not promise it
    (at 1M vectors: recall@10 0.64–0.98 for scopes of 1.5–7%, docs/performance-log.md §7)."""
    engine, provider = shared_index, GivenVector()
    k = 10
    for q in _queries(8):
        provider.vector = q
        got = service.search_text(engine, provider, scope, "x", limit=k, mode="semantic")
        assert [str(h["image"]["id"]) for h in got["items"]] == _exact(engine, "text_embeddings", scope, q, k)
        items = VQ.search_visual(engine, scope, model="vm", preprocess_version="p", dims=DIMS, vector=q, limit=k)
        assert [str(h["image"]["id"]) for h in items] == _exact(engine, "visual_embeddings", scope, q, k)
        assert got["coverage"] == {"ready": SIZES[scope], "total": SIZES[scope]}


def test_a_large_scope_is_searched_through_the_hnsw_index(shared_index, monkeypatch):
    """Above EXACT_SCAN_MAX_IMAGES the candidate query is served by the HNSW index (before issue
    18 a join to images, misestimated at one row, made the planner sort the whole scope instead:
    exact, but O(scope) — 0.2 s at 50k images), and its top 10 is close to the exact one."""
    engine, provider = shared_index, GivenVector()
    # "big" is large at this threshold; the others stay exact (raising=False: also runs on older code)
    monkeypatch.setattr(Q, "EXACT_SCAN_MAX_IMAGES", 1000, raising=False)
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY" in statement and "<=>" in statement and not statement.startswith("EXPLAIN"):
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.append("\n".join(r[0] for r in cursor.fetchall()))

    event.listen(engine, "before_cursor_execute", explain)
    try:
        hits = 0
        for q in _queries(5):
            provider.vector = q
            got = service.search_text(engine, provider, "big", "x", limit=10, mode="semantic")
            hits += len({str(h["image"]["id"]) for h in got["items"]}
                        & set(_exact(engine, "text_embeddings", "big", q, 10)))
            VQ.search_visual(engine, "big", model="vm", preprocess_version="p", dims=DIMS, vector=q, limit=10)
    finally:
        event.remove(engine, "before_cursor_execute", explain)
    assert len(plans) == 10
    for plan in plans:
        assert re.search(r"Index Scan using ix_(text|visual)_embeddings_hnsw", plan), plan
    assert hits >= 0.9 * 50  # approximate, but close (the benchmark measures recall)


def test_a_scope_above_the_exact_size_gets_its_own_hnsw_index(shared_index, monkeypatch):
    """``ensure_scope_vector_indexes`` gives every scope above the exact-scan size (and below half
    the images) its own partial HNSW index, once; a search of that scope is planned on it — also
    once psycopg prepares the statement — and returns its exact neighbours (at 1M vectors the
    filtered shared index gave mid-size scopes recall@10 0.83–0.93, docs/performance-log.md §8)."""
    engine, provider = shared_index, GivenVector()
    monkeypatch.setattr(Q, "EXACT_SCAN_MAX_IMAGES", 500)  # "mid" (700 images) is above it; "big" is 97 %
    names = {}
    for table, model in (("text_embeddings", "tm"), ("visual_embeddings", "vm")):
        built = ensure_scope_vector_indexes(engine, table, model, DIMS, min_images=Q.EXACT_SCAN_MAX_IMAGES)
        assert built == [scope_vector_index_name(table, model, DIMS, "mid")]
        assert ensure_scope_vector_indexes(engine, table, model, DIMS, min_images=Q.EXACT_SCAN_MAX_IMAGES) == []
        names[table] = built[0]
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY" in statement and "<=>" in statement and not statement.startswith("EXPLAIN"):
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.append("\n".join(r[0] for r in cursor.fetchall()))

    event.listen(engine, "before_cursor_execute", explain)
    try:
        hits = total = 0
        for q in _queries(8):  # more than psycopg's prepare threshold (5) on the pooled connection
            provider.vector = q
            got = service.search_text(engine, provider, "mid", "x", limit=10, mode="semantic")
            hits += len({str(h["image"]["id"]) for h in got["items"]} & set(_exact(engine, "text_embeddings", "mid", q, 10)))
            items = VQ.search_visual(engine, "mid", model="vm", preprocess_version="p", dims=DIMS, vector=q, limit=10)
            hits += len({str(h["image"]["id"]) for h in items} & set(_exact(engine, "visual_embeddings", "mid", q, 10)))
            total += 20
    finally:
        event.remove(engine, "before_cursor_execute", explain)
    assert len(plans) == 16
    for i, plan in enumerate(plans):
        assert f"Index Scan using {names['text_embeddings' if i % 2 == 0 else 'visual_embeddings']}" in plan, plan
    assert hits >= 0.98 * total


def test_memeflow_search_indexes_builds_the_scope_indexes_of_the_configured_models(engine, settings):
    """``memeflow search-indexes`` (what an operator or a cron job runs): the configured models'
    scopes above ``--min-images`` get their own index, once."""
    from click.testing import CliRunner

    from app.cli import main
    from app.config import reset_settings
    from app.orchestrator import Orchestrator

    cfg = Orchestrator(engine, settings).stage_configs
    model, dims = str(cfg.text["model"]), int(cfg.text["dims"])
    with engine.begin() as conn:
        for scope, n in (("big", 100), ("grown", 30), ("tiny", 3)):  # "big": over half, the shared index is its own
            conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, gen_random_uuid())"), {"s": scope})
            conn.execute(text(
                "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height,"
                " storage_key, metadata_hash) SELECT gen_random_uuid(), CAST(:s AS text),"
                " md5(CAST(:s AS text) || g) || md5(CAST(:s AS text) || g || 'x'),"
                " '.png', 'image/png', 1, 1, 1, 'k', 'h' FROM generate_series(1, :n) g"), {"s": scope, "n": n})
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,"
            f" document, embedding) SELECT scope_id, id, sha256, 'h', :m, {dims}, '1', '',"
            f" l2_normalize(ARRAY(SELECT random() - 0.5 FROM generate_series(1, {dims}) WHERE i.id IS NOT NULL)::vector)"
            " FROM images i"), {"m": model})
    env = {"MEMEFLOW_DATABASE_URL": settings.database_url, "MEMEFLOW_BROKER_URL": settings.broker_url,
           "MEMEFLOW_TEXT_PROVIDER": settings.text_provider, "MEMEFLOW_VISUAL_PROVIDER": settings.visual_provider,
           "MEMEFLOW_AGENT_PROVIDER": settings.agent_provider, "MEMEFLOW_VAR_DIR": str(settings.var_dir)}
    reset_settings()  # the CLI reads its settings from this env, not from what an earlier test cached
    try:
        runs = [CliRunner().invoke(main, ["search-indexes", "--min-images", "10"], env=env) for _ in range(2)]
    finally:
        reset_settings()
    assert [r.exit_code for r in runs] == [0, 0], [r.output for r in runs]
    name = scope_vector_index_name("text_embeddings", model, dims, "grown")
    assert name in runs[0].output and "text_embeddings" in runs[1].output and name not in runs[1].output
    with engine.connect() as conn:
        indexes = set(conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'text_embeddings'")).scalars())
    assert name in indexes and scope_vector_index_name("text_embeddings", model, dims, "tiny") not in indexes
