"""Alembic environment: the URL comes from the Alembic config (set by app.db.engine) or settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from app.db.engine import MIGRATE_LOCK_TIMEOUT_MS
from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from app.config import get_settings
    from app.runtime import resolve_urls

    return resolve_urls(get_settings()).database_url


def _include_object(obj, name, type_, reflected, compare_to):
    # Per-model HNSW indexes are created at run time (ensure_vector_index), not by the models.
    if type_ == "index" and name and "_hnsw_" in name:
        return False
    return True


#: Serialises concurrent ``memeflow db upgrade`` runs (two deploy hosts, an init container per
#: replica): the second waits for the first to commit, then reads the version it left and has
#: nothing to do, instead of failing on the first's half-created tables.
_MIGRATE_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('memeflow.migrate', 0))")


#: A migration may rewrite or index a whole table, and a second run waits on the lock above for
#: the first: neither may be cut short by a statement_timeout or lock_timeout the server, database
#: or role sets (managed PostgreSQL often does; a table lock's wait is bounded below, after the
#: migrate lock). UTC as in every runtime session (app.db.engine.SESSION_OPTIONS).
_SESSION_OPTIONS = "-c statement_timeout=0 -c lock_timeout=0 -c TimeZone=UTC"


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool, connect_args={"options": _SESSION_OPTIONS})
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, include_object=_include_object,
            compare_type=True,
        )
        with context.begin_transaction():
            # taken before Alembic reads the database's revision, held until this run commits
            connection.execute(_MIGRATE_LOCK)
            # after the advisory lock (a second run waits for the first as long as it takes): a
            # table lock live traffic holds is waited for only this long, then the run rolls back
            # and app.db.engine.upgrade_to_head tries again — the traffic queued behind it goes on
            connection.execute(text(f"SET LOCAL lock_timeout = {int(MIGRATE_LOCK_TIMEOUT_MS)}"))
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
