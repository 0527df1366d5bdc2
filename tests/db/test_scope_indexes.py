"""Per-scope HNSW indexes kept by maintenance (app/orchestrator/scope_indexes.py): a scope that
crosses the size threshold gets one, an invalid one is rebuilt (search answers exactly meanwhile),
a deleted scope or a model no longer served loses its index; search plans on a valid one."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sqlalchemy import event, text

from app.db.engine import scope_vector_index_name
from app.orchestrator import Orchestrator, StageConfigs, scope_indexes
from app.search import queries as Q
from app.search import service
from app.search.queries import vector_literal

DIMS = 8
TEXT = {"model": "tm", "dims": DIMS, "document_version": "1"}
CONFIGS = StageConfigs(visual={"model": "vm", "preprocess_version": "p", "dims": DIMS},
                       agent={"provider": "a", "model": "m"}, text=TEXT)


class GivenVector:
    def __init__(self) -> None:
        self.vector: list[float] = [0.0] * DIMS

    def config(self) -> dict:
        return {"model": "tm", "dims": DIMS}

    def embed_query(self, texts: list[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


def _images(engine, scope: str, n: int, start: int = 0) -> None:
    """``n`` images of ``scope`` with a current text embedding of "tm" (random unit vectors)."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, gen_random_uuid())"
                          " ON CONFLICT DO NOTHING"), {"s": scope})
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT md5(:s || g)::uuid, CAST(:s AS text), md5(:s || g) || md5(:s || g || 'x'), '.png',"
            " 'image/png', 1, 1, 1, 'k', 'h' FROM generate_series(:a, :b - 1) g"), {"s": scope, "a": start, "b": start + n})
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,"
            f" document, embedding) SELECT scope_id, id, sha256, 'h', 'tm', {DIMS}, '1', '',"
            f" l2_normalize(ARRAY(SELECT random() - 0.5 FROM generate_series(1, {DIMS}) WHERE i.id IS NOT NULL)::vector)"
            " FROM images i WHERE scope_id = :s AND NOT EXISTS (SELECT 1 FROM text_embeddings t WHERE t.image_id = i.id)"),
            {"s": scope})
        conn.execute(text("ANALYZE"))


def _indexes(engine) -> dict[str, bool]:
    return scope_indexes.existing(engine)


def _name(scope: str, model: str = "tm", table: str = "text_embeddings") -> str:
    return scope_vector_index_name(table, model, DIMS, scope)


@pytest.fixture()
def orch(engine, settings):
    return Orchestrator(engine, settings.replace(search_index_min_images=300), stage_configs=CONFIGS)


def test_a_scope_crossing_the_threshold_gets_its_index_once(orch, engine):
    _images(engine, "big", 3000)  # over half of all images: the shared index is mostly its own
    _images(engine, "grown", 200)
    _images(engine, "tiny", 5)
    first = scope_indexes.maintain(orch)
    assert not first.skipped and first.built == [] and _indexes(engine) == {}
    _images(engine, "grown", 500, start=200)  # 700 images: above 300
    second = scope_indexes.maintain(orch)
    assert sorted(second.built) == sorted([_name("grown"), _name("grown", "vm", "visual_embeddings")])
    assert _indexes(engine) == {n: True for n in second.built}
    again = scope_indexes.maintain(orch)
    assert again.built == [] and again.dropped == []  # idempotent


def test_a_pass_skips_while_another_holds_the_lock(orch, engine):
    _images(engine, "big", 3000)
    _images(engine, "grown", 700)
    with engine.connect() as other:
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": scope_indexes.LOCK_KEY}).scalar()
        assert scope_indexes.maintain(orch).skipped
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": scope_indexes.LOCK_KEY})
        other.commit()
    assert _name("grown") in scope_indexes.maintain(orch).built


def test_an_invalid_index_is_rebuilt_and_search_is_exact_meanwhile(orch, engine, monkeypatch):
    _images(engine, "big", 3000)
    _images(engine, "grown", 700)
    scope_indexes.maintain(orch)
    name = _name("grown")
    with engine.begin() as conn:  # what an interrupted CREATE INDEX CONCURRENTLY leaves
        conn.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(:n)"), {"n": name})
    assert _indexes(engine)[name] is False
    monkeypatch.setattr(Q, "EXACT_SCAN_MAX_IMAGES", 300)  # "grown" is searched through an HNSW index
    provider, plans = GivenVector(), []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY" in statement and "<=>" in statement and not statement.startswith("EXPLAIN"):
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.append("\n".join(r[0] for r in cursor.fetchall()))

    def search_all(n: int) -> tuple[int, int]:
        hits = total = 0
        for q in np.random.default_rng(3).normal(size=(n, DIMS)):
            provider.vector = (q / np.linalg.norm(q)).tolist()
            got = service.search_text(engine, provider, "grown", "x", limit=10, mode="semantic")
            hits += len({str(h["image"]["id"]) for h in got["items"]} & set(_exact(engine, "grown", provider.vector)))
            total += 10
        return hits, total

    event.listen(engine, "before_cursor_execute", explain)
    try:
        hits, total = search_all(3)  # while the scope's index is invalid: an exact scan, no HNSW index
        assert plans and not any(name in p for p in plans) and not any("hnsw" in p for p in plans), plans[0]
        assert hits == total  # a small set: every neighbour found
        report = scope_indexes.maintain(orch)
        assert name in report.dropped and name in report.built and _indexes(engine)[name] is True
        plans.clear()
        hits, total = search_all(6)  # beyond psycopg's prepare threshold: still planned on the scope's index
        assert len(plans) == 6 and all(f"Index Scan using {name}" in p for p in plans), plans[0]
        assert hits >= 0.98 * total
    finally:
        event.remove(engine, "before_cursor_execute", explain)


def test_a_scope_waiting_for_its_index_is_searched_exactly(orch, engine, monkeypatch):
    """Between crossing the exact-scan size and maintenance building its index, a mid-size scope is
    still searched exactly (not through the shared index, which misses such scopes' neighbours); the
    largest scope, which gets no index of its own, and a scope past the fallback size use the shared one."""
    _images(engine, "big", 3000)
    _images(engine, "grown", 700)
    monkeypatch.setattr(Q, "EXACT_SCAN_MAX_IMAGES", 300)
    with engine.connect() as conn:
        assert Q.exact_scan(conn, "grown", _name("grown"))  # no index of its own yet
        assert not Q.exact_scan(conn, "big", _name("big"))  # 81 % of all images: the shared index
        assert not Q.exact_scan(conn, "grown")  # no index named: the size rule alone
    monkeypatch.setattr(Q, "EXACT_SCAN_FALLBACK_MAX_IMAGES", 600)
    with engine.connect() as conn:
        assert not Q.exact_scan(conn, "grown", _name("grown"))  # too big to scan: the shared index
    monkeypatch.setattr(Q, "EXACT_SCAN_FALLBACK_MAX_IMAGES", 60_000)
    scope_indexes.maintain(orch)
    with engine.connect() as conn:
        assert not Q.exact_scan(conn, "grown", _name("grown"))  # its index is valid: HNSW on it


def test_a_deleted_scope_or_a_model_no_longer_served_loses_its_index(orch, engine, settings):
    _images(engine, "big", 3000)
    _images(engine, "grown", 700)
    _images(engine, "other", 700)
    scope_indexes.maintain(orch)
    assert {_name("grown"), _name("other")} <= set(_indexes(engine))
    with engine.begin() as conn:  # the scope goes (its rows first)
        for table in ("text_embeddings", "images", "scope_usage"):
            conn.execute(text(f"DELETE FROM {table} WHERE scope_id = 'grown'"))
        conn.execute(text("DELETE FROM scopes WHERE id = 'grown'"))
    report = scope_indexes.maintain(orch)
    assert _name("grown") in report.dropped and _name("grown") not in _indexes(engine)
    assert _name("other") in _indexes(engine)
    # the text model changes and no scope's search serving state names "tm" any more
    changed = Orchestrator(engine, orch.settings, stage_configs=StageConfigs(
        visual=CONFIGS.visual, agent=CONFIGS.agent, text={**TEXT, "model": "tm2"}))
    report = scope_indexes.maintain(changed)
    assert _name("other") in report.dropped and _name("other", "tm2") in report.built
    assert _name("other", "vm", "visual_embeddings") in _indexes(engine)  # the visual model stays served


def test_a_model_a_scopes_search_serving_names_keeps_its_index(orch, engine):
    _images(engine, "big", 3000)
    _images(engine, "grown", 700)
    orch.sweep()  # records each scope's serving state: served by "tm"
    scope_indexes.maintain(orch)
    changed = Orchestrator(engine, orch.settings, stage_configs=StageConfigs(
        visual=CONFIGS.visual, agent=CONFIGS.agent, text={**TEXT, "model": "tm2"}))
    report = scope_indexes.maintain(changed)  # "grown" still reads "tm" until its cutover
    assert _name("grown") not in report.dropped and _name("grown", "tm2") in report.built
    assert {_name("grown"), _name("grown", "tm2")} <= set(_indexes(engine))


def test_scope_index_names_never_match_a_shared_index():
    from app.db.engine import vector_index_name

    for model in ("s_0123456789abcdef", "s", "multilingual-e5-small"):
        assert not scope_indexes.SCOPE_INDEX_NAME.match(vector_index_name("text_embeddings", model, 384))
    assert re.match(scope_indexes.SCOPE_INDEX_NAME, _name("x"))


def _exact(engine, scope: str, q: list[float], k: int = 10) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            f"SELECT e.image_id::text, e.embedding::vector({DIMS}) <=> CAST(:q AS vector({DIMS})) AS d"
            " FROM text_embeddings e WHERE e.scope_id = :s AND e.model = 'tm'"), {"q": vector_literal(q), "s": scope}).all()
    return [r[0] for r in sorted(rows, key=lambda r: (r[1], r[0]))[:k]]
