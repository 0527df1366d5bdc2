"""``make_engine``'s pre-ping: a pooled connection whose server side went away is replaced on
checkout, never handed out; a healthy connection back from the pool a moment ago passes without
the round trip (docs/performance-log.md §33)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from app.db import engine as engine_mod
from app.db.engine import make_engine


@pytest.fixture()
def round_trips(monkeypatch) -> list[int]:
    """Every round-trip ping the engines made next send (SQLAlchemy's own ``do_ping``)."""
    calls: list[int] = []
    original = PGDialect_psycopg.do_ping

    def counting(self, dbapi_connection):
        calls.append(1)
        return original(self, dbapi_connection)

    monkeypatch.setattr(PGDialect_psycopg, "do_ping", counting)
    return calls


def _backend_pid(eng) -> int:
    with eng.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def test_a_connection_back_from_the_pool_a_moment_ago_is_not_pinged(db_url, round_trips):
    eng = make_engine(db_url, pool_size=1, max_overflow=0)
    try:
        first = _backend_pid(eng)
        for _ in range(5):
            assert _backend_pid(eng) == first  # the same pooled connection each time
        assert round_trips == []
    finally:
        eng.dispose()


def test_a_connection_idle_longer_than_the_limit_gets_the_round_trip(db_url, round_trips, monkeypatch):
    eng = make_engine(db_url, pool_size=1, max_overflow=0)
    try:
        first = _backend_pid(eng)
        monkeypatch.setattr(engine_mod.time, "monotonic", lambda: 1e12)  # "hours later"
        assert _backend_pid(eng) == first
        assert round_trips == [1]
    finally:
        eng.dispose()


@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_terminated_backend_is_replaced_on_checkout_not_handed_out(db_url, engine, round_trips, in_transaction):
    eng = make_engine(db_url, pool_size=2, max_overflow=0)
    try:
        with eng.connect() as a, eng.connect() as b:  # two pooled connections
            pids = {a.execute(text("SELECT pg_backend_pid()")).scalar_one(),
                    b.execute(text("SELECT pg_backend_pid()")).scalar_one()}
        with engine.connect() as admin:  # as a PostgreSQL restart does to every backend
            for pid in pids:  # the timeout: returns once the backend has exited
                assert admin.execute(text("SELECT pg_terminate_backend(:p, 10000)"), {"p": pid}).scalar_one()
        if in_transaction:
            with eng.begin() as conn:
                conn.execute(text("CREATE TEMP TABLE t (v int)"))
                new = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        else:
            new = _backend_pid(eng)  # no OperationalError: the dead connection never reached us
        assert new not in pids
        assert round_trips, "the dead connection was pinged (and failed) before being replaced"
        assert _backend_pid(eng) not in pids  # the other dead one went with the pool's invalidation
    finally:
        eng.dispose()


def test_without_pre_ping_a_terminated_backend_fails_its_first_statement(db_url, engine):
    """The control: what the check above prevents (the workers' engines handle it by retrying)."""
    from sqlalchemy.exc import OperationalError

    eng = make_engine(db_url, pool_size=1, max_overflow=0, pre_ping=False)
    try:
        pid = _backend_pid(eng)
        with engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p, 10000)"), {"p": pid})
        with pytest.raises(OperationalError):
            _backend_pid(eng)
    finally:
        eng.dispose()
