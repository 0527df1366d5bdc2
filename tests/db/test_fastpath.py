"""``app.db.fastpath``: the store's ``sql()`` statements run on the psycopg cursor for a connection
of ``make_engine``, and answer exactly as SQLAlchemy's own path does (rows, mappings, scalars,
rowcount, errors, UUID lists bound in binary). It relies on private SQLAlchemy methods, so this
runs it against the installed version."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from app.db import fastpath
from app.db.engine import make_engine
from app.orchestrator.store._sql import sql

CREATE = sql("CREATE TEMP TABLE fp (id uuid PRIMARY KEY, n int NOT NULL, label text)")
INSERT = sql("INSERT INTO fp (id, n, label) VALUES (:id, :n, :label) RETURNING id, n")
BY_IDS = sql("SELECT id, n, label FROM fp WHERE id = ANY(:ids) ORDER BY n")
BUMP = sql("UPDATE fp SET n = n + 1 WHERE n >= :n")
BAD = sql("SELECT no_such_column FROM fp")
# column names as the result gives them (the fast path reads them off the result, not description)
ALIASED = sql('SELECT n AS "ñ col", label AS "中", n + 1 FROM fp WHERE n >= :n ORDER BY n')
NO_COLUMNS = sql("SELECT FROM fp")


def _exercise(conn) -> dict:
    ids = [uuid.UUID(int=i + 1) for i in range(5)]
    conn.execute(CREATE)
    inserted = [conn.execute(INSERT, {"id": i, "n": k, "label": f"é{k}\u4e2d"}).mappings().one() for k, i in enumerate(ids)]
    out = {
        "inserted": [dict(r) for r in inserted],
        "mappings": [dict(r) for r in conn.execute(BY_IDS, {"ids": ids[1:4]}).mappings().all()],
        "scalars": conn.execute(BY_IDS, {"ids": ids}).scalars().all(),
        "first": tuple(conn.execute(BY_IDS, {"ids": [ids[4]]}).first()),
        "none": conn.execute(BY_IDS, {"ids": [uuid.UUID(int=99)]}).first(),
        "rowcount": conn.execute(BUMP, {"n": 2}).rowcount,
        "after": conn.execute(BY_IDS, {"ids": ids}).scalars().all(),
        "aliased": [dict(r) for r in conn.execute(ALIASED, {"n": 0}).mappings().all()],
        "aliased_none": list(conn.execute(ALIASED, {"n": 99}).keys()),
        "no_columns": len(conn.execute(NO_COLUMNS).all()),
    }
    with pytest.raises(IntegrityError):
        conn.execute(INSERT, {"id": ids[0], "n": 0, "label": None})
    conn.rollback()
    with pytest.raises(ProgrammingError):
        conn.execute(BAD)
    conn.rollback()
    return out


def test_the_fast_path_is_taken_and_answers_as_sqlalchemy_does(db_url, monkeypatch):
    assert fastpath.SUPPORTED, "the installed SQLAlchemy lacks what app/db/fastpath.py calls"
    fast_calls = []
    original = fastpath.FastConnection._fast_execute

    def counting(self, clause, params):
        fast_calls.append(clause.text)
        return original(self, clause, params)

    monkeypatch.setattr(fastpath.FastConnection, "_fast_execute", counting)
    engine = make_engine(db_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            assert isinstance(conn, fastpath.FastConnection)
            fast = _exercise(conn)
        assert len(fast_calls) >= 10  # every sql() statement above went the fast way
        fast_calls.clear()
        with engine.connect() as conn:
            seen = []
            event.listen(conn, "before_cursor_execute", lambda *a: seen.append(a[2]))  # forces SQLAlchemy's path
            ordinary = _exercise(conn)
            assert seen and fast_calls == []
            conn.execute(text("SELECT 1"))  # non-sql() statements always go SQLAlchemy's way
    finally:
        engine.dispose()
    assert fast == ordinary
    assert fast["rowcount"] == 3 and fast["scalars"] == [uuid.UUID(int=i + 1) for i in range(5)]
