"""CLI commands over a scope's images refuse a scope that does not exist: exit 1 with a message
that names it, and nothing created (``process-all --scope typo`` made an empty scope and reported
"0 images"). Reads of the default scope before anything was uploaded stay an empty library."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from app.cli import main
from app.config import reset_settings
from tests.api.conftest import png_bytes, upload

OVER_A_SCOPE = [
    ["process-all", "--scope", "typo"],
    ["process-all", "--scope", "typo", "--wait", "--timeout", "5"],
    ["status", "--scope", "typo"],
    ["status", "--scope", "typo", "--json"],
    ["search", "cat", "--scope", "typo"],
    ["search-model", "status", "--scope", "typo"],
    ["search-model", "cutover", "--scope", "typo"],
    ["search-model", "rollback", "--scope", "typo"],
    ["search-model", "resume", "--scope", "typo"],
    ["tokens", "list", "--scope", "typo"],
    ["tokens", "revoke", "ops", "--scope", "typo"],
]


@pytest.fixture()
def cli(settings):
    reset_settings(settings)
    try:
        yield CliRunner(env={"COLUMNS": "200"})
    finally:
        reset_settings(None)


def _rows(engine) -> tuple[list, int]:
    with engine.connect() as conn:
        scopes = sorted(conn.execute(text("SELECT id FROM scopes")).scalars())
        return scopes, conn.execute(text("SELECT count(*) FROM batches")).scalar_one()


@pytest.mark.parametrize("args", OVER_A_SCOPE, ids=" ".join)
def test_an_unknown_scope_is_refused_and_nothing_is_created(args, cli, client, engine):
    assert upload(client, png_bytes(), process=False).status_code == 201  # the scope "local" exists
    before = _rows(engine)
    r = cli.invoke(main, args)
    assert r.exit_code == 1, r.output
    assert "scope 'typo' does not exist" in r.output and "Traceback" not in r.output, r.output
    assert _rows(engine) == before


def test_process_all_over_an_existing_scope_still_makes_its_batch(cli, client, engine):
    assert upload(client, png_bytes(), process=False).status_code == 201
    r = cli.invoke(main, ["process-all", "--scope", "local"])
    assert r.exit_code == 0 and "1 images" in r.output, r.output
    assert _rows(engine) == (["local"], 1)


def test_before_any_upload_reads_of_the_default_scope_are_empty_and_process_all_refuses(cli, engine):
    assert _rows(engine) == ([], 0)
    r = cli.invoke(main, ["status", "--json"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(main, ["search", "cat"])
    assert r.exit_code == 1 and "does not exist" not in r.output, r.output  # no hit: exit 1, as before
    r = cli.invoke(main, ["process-all"])  # it would create the scope: refused, even by default
    assert r.exit_code == 1 and "scope 'local' does not exist" in r.output, r.output
    assert _rows(engine) == ([], 0)


def test_tokens_of_an_existing_scope_without_tokens_list_nothing(cli, client):
    assert upload(client, png_bytes(), process=False).status_code == 201  # the scope "local" exists
    r = cli.invoke(main, ["tokens", "list", "--scope", "local"])
    assert r.exit_code == 0 and r.output == "", r.output
