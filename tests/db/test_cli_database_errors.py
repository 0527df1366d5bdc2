"""The CLI's one-line database errors (app.cli.common.friendly_errors) tell a database that cannot
be reached from one that answered and cancelled the statement (a statement or lock timeout): "cannot
reach the database" for the latter sent an operator to check the network."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from app.cli.common import friendly_errors
from app.db.engine import make_engine


def _run(fn) -> str:
    @click.command()
    @friendly_errors
    def cmd():
        fn()

    result = CliRunner().invoke(cmd, [])
    assert result.exit_code == 1, result.output
    return result.output


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])  # the runtime's, the migrations'
def test_a_statement_timeout_is_not_reported_as_an_unreachable_database(db_url, driver):
    engine = create_engine(make_url(db_url).set(drivername=f"postgresql+{driver}"), poolclass=NullPool)

    def slow():
        with engine.connect() as conn:
            conn.execute(text("SET statement_timeout = 50"))
            conn.execute(text("SELECT pg_sleep(5)"))

    out = _run(slow)
    assert "cannot reach" not in out, out
    assert "refused the operation (SQLSTATE 57014)" in out and "statement timeout" in out, out


def test_an_unreachable_database_is_still_reported_so():
    gone = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", pool_size=1, max_overflow=0)

    def connect():
        with gone.connect():
            pass

    try:
        out = _run(connect)
    finally:
        gone.dispose()
    assert "cannot reach the database" in out, out
