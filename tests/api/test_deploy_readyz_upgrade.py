"""A rolling upgrade as docs/operations.md §4 runs it: `migrate` (the new release) first, then the
processes one by one. Until an API replica is replaced, its code is older than the database. The
workers and the API's own start check allow that (a newer release's migrations keep the old code
working); /readyz must too, or every old replica leaves its load balancer the moment the
migration commits — an outage until the new replicas are up. A database *behind* the code stays
503 (nothing can serve on it)."""

from __future__ import annotations

import psycopg2

from app.api import create_app
from app.auth import LocalScopeResolver


def _set_version(url: str, version: str) -> None:
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("UPDATE alembic_version SET version_num = %s", (version,))
    conn.close()


def _readyz(settings, engine, orch, publisher, store):
    app = create_app(scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=orch, engine=engine,
                     publisher=publisher, store=store, cursor_secret_key="test-secret")
    return app.test_client().get("/readyz")


def test_readyz_stays_ready_on_a_database_a_newer_release_migrated(db_url, settings, engine, orch, publisher, store):
    _set_version(db_url, "9999_from_a_newer_release")
    r = _readyz(settings, engine, orch, publisher, store)
    body = r.get_json()
    assert r.status_code == 200, body
    assert body["checks"]["migrations"]["ok"] is True and body["checks"]["migrations"].get("ahead") is True
    assert body["status"] == "degraded"
    assert "migrations_ahead" in [reason["code"] for reason in body["reasons"]]


def test_readyz_is_503_on_a_database_behind_the_code(db_url, settings, engine, orch, publisher, store):
    _set_version(db_url, "0001")
    r = _readyz(settings, engine, orch, publisher, store)
    assert r.status_code == 503, r.get_json()
    assert r.get_json()["checks"]["migrations"]["ok"] is False


def test_readyz_reports_unreadable_migration_scripts_as_a_failed_check(settings, engine, orch, publisher, store,
                                                                        monkeypatch):
    """An image missing its migrations/ directory: a 503 with the failed check, never a 500."""
    from app.api import health

    def unreadable():
        raise FileNotFoundError("migrations/")

    monkeypatch.setattr(health, "_code_revisions", unreadable)
    r = _readyz(settings, engine, orch, publisher, store)
    assert r.status_code == 503, r.get_data(as_text=True)
    assert r.get_json()["checks"]["migrations"]["ok"] is False
