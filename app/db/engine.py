"""Engine construction and small schema helpers (vector indexes, migration head check)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import Connection

from app.db import fastpath, jsoncodec

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_SAFE_MODEL = re.compile(r"[^a-z0-9]+")


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 10, echo: bool = False, pre_ping: bool = True
) -> Engine:
    """An engine for ``url`` with short timeouts; statements never wait minutes on a lock.

    Its connections run the store's parsed statements on the psycopg cursor directly
    (``app.db.fastpath``); everything else goes through SQLAlchemy as usual.

    ``pre_ping=False`` (workers) saves a round trip per checkout; a connection broken by a
    database restart is then detected on use, the pool is invalidated and the orchestrator
    retries that operation once (``execution.retry_on_disconnect``).
    """
    engine = create_engine(
        driver_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        echo=echo,
        json_deserializer=jsoncodec.loads,  # psycopg's loader of json/jsonb results (app.db.jsoncodec)
        connect_args={"options": "-c lock_timeout=10000 -c statement_timeout=120000", "connect_timeout": 10},
    )
    if fastpath.SUPPORTED:  # the store's statements skip SQLAlchemy's execution overhead
        engine._connection_cls = fastpath.FastConnection
    return engine


def read_connection(engine: Engine) -> Connection:
    """A connection for a block of reads only, in autocommit: no BEGIN, no COMMIT, and above all
    no ROLLBACK when it closes — psycopg drops every prepared statement of its connection on
    ROLLBACK (and sends DEALLOCATE ALL), so a rolled-back read per batch kept the worker's hot
    statements from ever being prepared (docs/performance.md §19). Each statement sees its own
    snapshot, as every statement of a READ COMMITTED transaction does; never write through it."""
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def driver_url(url: str) -> str:
    """``url`` on the psycopg 3 driver, whatever driver it names (``postgresql://`` included).

    psycopg 3 binds parameters on the server and prepares a statement the fifth time a
    connection runs it, so the orchestrator's hot statements are planned once per connection
    instead of on every execution.
    """
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def vector_index_name(table: str, model: str, dims: int) -> str:
    """The per-model index name (≤ 63 bytes). A slug longer than 30 characters keeps its first 21
    and a hash of the full model name, so long names that share a prefix (open_clip's
    ``<architecture>@<checkpoint hash>``) still get an index each."""
    slug = _SAFE_MODEL.sub("_", model.lower()).strip("_")
    if len(slug) > 30:
        slug = f"{slug[:21]}_{hashlib.sha256(model.encode()).hexdigest()[:8]}"
    return f"ix_{table}_hnsw_{slug}_{dims}"


def ensure_vector_index(conn: Connection, table: str, model: str, dims: int) -> str:
    """Create the per-model partial HNSW expression index if missing (SPEC §3: models coexist)."""
    if table not in ("visual_embeddings", "text_embeddings"):
        raise ValueError(f"no vector column on {table}")
    name = vector_index_name(table, model, int(dims))
    if conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar():
        return name  # already there: don't take the table lock CREATE INDEX needs
    # concurrent IF NOT EXISTS can still collide in pg_class: one creator per index name at a time
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
    if conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar():
        return name
    literal = model.replace("'", "''")
    conn.execute(
        text(
            f'CREATE INDEX IF NOT EXISTS "{name}" ON {table} '
            f"USING hnsw ((embedding::vector({int(dims)})) vector_cosine_ops) "
            f"WHERE model = '{literal}' AND dims = {int(dims)}"
        )
    )
    return name


def scope_vector_index_name(table: str, model: str, dims: int, scope_id: str) -> str:
    """The name of one scope's own HNSW index of a model (≤ 63 bytes: a hash of model, dims, scope)."""
    digest = hashlib.sha256(f"{model}\x00{int(dims)}\x00{scope_id}".encode()).hexdigest()[:16]
    return f"ix_{table}_hnsw_s_{digest}"


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_to_head(url: str) -> None:
    from alembic import command

    command.upgrade(alembic_config(url), "head")


def migration_status(conn: Connection) -> tuple[str | None, str]:
    """(current revision in the database, head revision of the code)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(str(conn.engine.url)))
    current = MigrationContext.configure(conn).get_current_revision()
    return current, script.get_current_head() or ""
