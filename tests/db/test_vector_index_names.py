"""Two models whose index slugs collide each get an HNSW index of their own.

``vector_index_name`` lowercases a model name and folds every other character to ``_``, so
``Foo/Bar`` and ``foo_bar`` both map to ``ix_text_embeddings_hnsw_foo_bar_<dims>``; the second
model's ensure saw that name taken and had no index (its searches scanned the table). The name
already in place is checked against its definition (the model in its predicate), and a model it
does not belong to gets a hashed name; existing indexes keep their names."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.db.engine import (
    ensure_vector_index,
    ensure_vector_index_concurrently,
    hashed_vector_index_name,
    vector_index_name,
)
from app.orchestrator.scope_indexes import SCOPE_INDEX_NAME

DIMS = 4
TABLE = "text_embeddings"
FIRST, SECOND = "Foo/Bar", "foo_bar"  # one slug


def _rows(conn, model: str, n: int = 20) -> None:
    conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('s', gen_random_uuid()) ON CONFLICT DO NOTHING"))
    for k in range(n):
        key = f"{model}{k}"
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT md5(k)::uuid, 's', md5(k) || md5(k || 'x'), '.png', 'image/png', 1, 1, 1, 'k', 'h'"
            " FROM (SELECT CAST(:k AS text) AS k) x ON CONFLICT DO NOTHING"), {"k": key})
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,"
            " document, embedding) SELECT 's', md5(k)::uuid, md5(k) || md5(k || 'x'), 'h', :m, :d, '1', '',"
            " CAST(:v AS vector) FROM (SELECT CAST(:k AS text) AS k) x"),
            {"k": key, "m": model, "d": DIMS, "v": str([float(k % 5 + j) for j in range(DIMS)])})


def _plan(conn, model: str) -> str:
    conn.execute(text("SET enable_seqscan = off"))
    try:
        return "\n".join(r[0] for r in conn.execute(text(
            f"EXPLAIN SELECT image_id FROM text_embeddings WHERE model = :m AND dims = {DIMS} "
            f"ORDER BY embedding::vector({DIMS}) <=> '[1,2,3,4]'::vector({DIMS}) LIMIT 5"), {"m": model}))
    finally:
        conn.execute(text("RESET enable_seqscan"))


def _indexes(conn) -> dict[str, str]:
    return dict(conn.execute(text(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = :t AND indexdef LIKE '%USING hnsw%'"),
        {"t": TABLE}).all())


def test_the_names_collide_and_the_hashed_name_is_apart():
    assert vector_index_name(TABLE, FIRST, DIMS) == vector_index_name(TABLE, SECOND, DIMS)
    hashed = {hashed_vector_index_name(t, m, d) for t in ("text_embeddings", "visual_embeddings")
              for m in (FIRST, SECOND) for d in (DIMS, 16000)}
    assert len(hashed) == 8 and all(len(n) <= 63 and not SCOPE_INDEX_NAME.match(n) for n in hashed)


@pytest.mark.parametrize("build", ["in the transaction", "concurrently"])
def test_models_of_one_slug_get_an_index_each_and_searches_use_their_own(engine, build):
    with engine.begin() as conn:
        _rows(conn, FIRST)
        _rows(conn, SECOND)

    def ensure(model: str) -> str:
        if build == "concurrently":
            assert ensure_vector_index_concurrently(engine, TABLE, model, DIMS) is True
            with engine.connect() as conn:  # the index that holds this model's rows
                return next(n for n, d in _indexes(conn).items() if f"'{model}'" in d)
        with engine.begin() as conn:
            return ensure_vector_index(conn, TABLE, model, DIMS)

    first, second = ensure(FIRST), ensure(SECOND)
    assert first == vector_index_name(TABLE, FIRST, DIMS)  # the first keeps the readable name
    assert second == hashed_vector_index_name(TABLE, SECOND, DIMS)
    assert ensure(FIRST) == first and ensure(SECOND) == second  # stable: nothing built twice
    with engine.connect() as conn:
        indexes = _indexes(conn)
        assert set(indexes) == {first, second}
        assert f"'{FIRST}'" in indexes[first] and f"'{SECOND}'" in indexes[second]
        assert first in _plan(conn, FIRST)
        assert second in _plan(conn, SECOND)


def test_an_existing_deployments_collided_model_gets_its_index(engine):
    """A deployment where the first model's index took the name (and the second has none)."""
    with engine.begin() as conn:
        _rows(conn, FIRST)
        _rows(conn, SECOND)
        conn.execute(text(
            f'CREATE INDEX "{vector_index_name(TABLE, FIRST, DIMS)}" ON text_embeddings '
            f"USING hnsw ((embedding::vector({DIMS})) vector_cosine_ops) WHERE model = '{FIRST}' AND dims = {DIMS}"))
    assert ensure_vector_index_concurrently(engine, TABLE, SECOND, DIMS) is True
    with engine.connect() as conn:
        assert hashed_vector_index_name(TABLE, SECOND, DIMS) in _plan(conn, SECOND)
        assert vector_index_name(TABLE, FIRST, DIMS) in _plan(conn, FIRST)  # untouched


def test_a_model_quoted_or_odd_is_recognised_as_the_owner_of_its_index(engine):
    odd = "it's a/Model\\x"  # a quote and a backslash in the predicate's literal
    with engine.begin() as conn:
        _rows(conn, odd)
        name = ensure_vector_index(conn, TABLE, odd, DIMS)
    assert name == vector_index_name(TABLE, odd, DIMS)
    with engine.begin() as conn:
        assert ensure_vector_index(conn, TABLE, odd, DIMS) == name
        assert set(_indexes(conn)) == {name}
