"""Engine construction and small schema helpers (vector indexes, migration head check)."""

from __future__ import annotations

import hashlib
import logging
import re
import select
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection

from app.db import fastpath, jsoncodec

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_SAFE_MODEL = re.compile(r"[^a-z0-9]+")


#: Every session's settings, whatever the server, database or role defaults say: short lock and
#: statement timeouts, and UTC, so the timestamps it reads (``timestamptz`` values, rendered with
#: the session's offset) are UTC in every API response and event (SPEC §3) on a PostgreSQL whose
#: default TimeZone is another.
SESSION_OPTIONS = "-c lock_timeout=10000 -c statement_timeout=120000 -c TimeZone=UTC"


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 10, echo: bool = False, pre_ping: bool = True
) -> Engine:
    """An engine for ``url`` with short timeouts; statements never wait minutes on a lock.

    Its connections run the store's parsed statements on the psycopg cursor directly
    (``app.db.fastpath``); everything else goes through SQLAlchemy as usual.

    ``pre_ping=True`` (the API, the CLI): a connection checked out of the pool is known alive
    before its first statement, without a round trip when it can be told locally
    (:func:`install_local_ping`); a dead one is replaced transparently.
    ``pre_ping=False`` (workers) saves even that; a connection broken by a database restart is
    then detected on use, the pool is invalidated and the orchestrator retries that operation
    once (``execution.retry_on_disconnect``).
    """
    engine = create_engine(
        driver_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        echo=echo,
        json_deserializer=jsoncodec.loads,  # psycopg's loader of json/jsonb results (app.db.jsoncodec)
        connect_args={"options": SESSION_OPTIONS, "connect_timeout": 10},
    )
    if fastpath.SUPPORTED:  # the store's statements skip SQLAlchemy's execution overhead
        engine._connection_cls = fastpath.FastConnection
    if pre_ping:
        install_local_ping(engine)
    return engine


#: A connection idle in the pool for longer than this gets the real round-trip ping.
PING_AFTER_IDLE_S = 10.0
_IDLE_SINCE = "_memeflow_idle_since"
_POLL_EVENTS = select.POLLIN | select.POLLPRI


def install_local_ping(engine: Engine, *, after_idle_s: float | None = None) -> None:
    """Make the pool's pre-ping free for a connection that proves itself alive locally.

    SQLAlchemy's pre-ping sends an empty query on every checkout — a round trip, and API and
    PostgreSQL CPU, per transaction (docs/performance-log.md §33). A PostgreSQL restart (or a
    terminated backend, an idle-session timeout, a crash) never leaves a connection silently
    dead: the server's side of the socket closes (and usually says why, a FATAL first), so the
    idle connection's socket turns readable — end of file, or the message. So a connection passes
    without a round trip when libpq has not seen it fail, it is idle outside a transaction, it went
    back to the pool at most ``after_idle_s`` ago (default :data:`PING_AFTER_IDLE_S`), and a
    zero-timeout poll finds nothing to read on its socket: nothing can have arrived on a healthy
    idle connection. Anything else — something to read, a long idle (a host or network that
    vanished without closing the socket cannot be seen locally), a non-psycopg connection —
    gets SQLAlchemy's ordinary round-trip ping, and a failed ping reconnects as before.
    """
    limit = PING_AFTER_IDLE_S if after_idle_s is None else after_idle_s
    dialect = engine.dialect
    round_trip = dialect.do_ping

    @event.listens_for(engine.pool, "checkin")
    def _idle_since(dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is not None:
            try:
                setattr(dbapi_connection, _IDLE_SINCE, time.monotonic())
            except AttributeError:  # a DBAPI connection without a __dict__: always the round trip
                pass

    def do_ping(self: Any, dbapi_connection: Any) -> bool:
        if alive_locally(dbapi_connection, limit):
            return True
        return round_trip(dbapi_connection)

    dialect.do_ping = types.MethodType(do_ping, dialect)


def alive_locally(dbapi_connection: Any, after_idle_s: float = PING_AFTER_IDLE_S) -> bool:
    """True when the psycopg connection is certainly usable without asking the server (see
    :func:`install_local_ping`); False means "not known": ping it."""
    idle_since = getattr(dbapi_connection, _IDLE_SINCE, None)
    if idle_since is None or time.monotonic() - idle_since > after_idle_s:
        return False
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is None or getattr(dbapi_connection, "closed", True) or getattr(dbapi_connection, "broken", True):
        return False
    try:
        from psycopg.pq import ConnStatus, TransactionStatus

        if pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
            return False
        fd = pgconn.socket
        poller = select.poll()
        poller.register(fd, _POLL_EVENTS)
        return not poller.poll(0)  # POLLHUP / POLLERR are reported whatever was asked for
    except Exception:  # noqa: BLE001 - any doubt: the round trip decides
        return False


def read_connection(engine: Engine) -> Connection:
    """A connection for a block of reads only, in autocommit: no BEGIN, no COMMIT, and above all
    no ROLLBACK when it closes — psycopg drops every prepared statement of its connection on
    ROLLBACK (and sends DEALLOCATE ALL), so a rolled-back read per batch kept the worker's hot
    statements from ever being prepared (docs/performance-log.md §19). Each statement sees its own
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


def hashed_vector_index_name(table: str, model: str, dims: int) -> str:
    """The index name of a model whose :func:`vector_index_name` belongs to another model's index
    (two names that differ only in case or in the characters the slug folds: ``Foo/Bar``,
    ``foo_bar``). Its slug, ``h`` and 30 hex digits of a hash of the model name, is longer than
    any :func:`vector_index_name` slug (at most 30), so the two kinds of name never meet; ≤ 63
    bytes for dims of up to 5 digits."""
    return f"ix_{table}_hnsw_h{hashlib.sha256(model.encode()).hexdigest()[:30]}_{int(dims)}"


#: the index of that name, if any: (its table, its predicate); (None, None) for a relation that is not an index
_INDEX_PREDICATE = text(
    "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM (SELECT to_regclass(:n) AS oid) r"
    " LEFT JOIN pg_index i ON i.indexrelid = r.oid LEFT JOIN pg_class c ON c.oid = i.indrelid"
    " WHERE r.oid IS NOT NULL"
)
#: the predicate the per-model index is built with, as PostgreSQL prints it back
_MODEL_PREDICATE = re.compile(r"\(\(model = '((?:[^']|'')*)'::text\) AND \(dims = (\d+)\)\)")


def vector_index_for(conn: Connection, table: str, model: str, dims: int) -> str:
    """The name of the per-model index of (table, model, dims), built or to build: the readable
    :func:`vector_index_name`, unless a relation of that name is not this model's index — another
    model of the same slug took it first — then :func:`hashed_vector_index_name`. An index already
    built keeps its name (renaming it would rebuild it). Ownership is read from the index's
    predicate (``WHERE model = '…' AND dims = …``, as ``pg_get_expr`` prints it); one that does
    not parse counts as another's, so the worst case is an extra index, never a model without one."""
    name = vector_index_name(table, model, dims)
    row = conn.execute(_INDEX_PREDICATE, {"n": name}).first()
    if row is None:
        return name
    found = _MODEL_PREDICATE.fullmatch(row[1] or "")
    mine = (row[0] == table and found is not None and found.group(1).replace("''", "'") == model
            and int(found.group(2)) == int(dims))
    return name if mine else hashed_vector_index_name(table, model, dims)


def _create_vector_index_sql(name: str, table: str, model: str, dims: int, *, concurrently: bool) -> str:
    literal = model.replace("'", "''")
    return (
        f'CREATE INDEX {"CONCURRENTLY " if concurrently else ""}IF NOT EXISTS "{name}" ON {table} '
        f"USING hnsw ((embedding::vector({int(dims)})) vector_cosine_ops) "
        f"WHERE model = '{literal}' AND dims = {int(dims)}"
    )


_EXISTS = text("SELECT to_regclass(:n) IS NOT NULL")
_BUILDER_LOCK = text("SELECT pg_advisory_xact_lock(hashtext(:n))")


def ensure_vector_index(conn: Connection, table: str, model: str, dims: int) -> str:
    """Create the per-model partial HNSW expression index if missing (SPEC §3: models coexist);
    return its name (:func:`vector_index_for`)."""
    if table not in ("visual_embeddings", "text_embeddings"):
        raise ValueError(f"no vector column on {table}")
    name = vector_index_for(conn, table, model, int(dims))
    if conn.execute(_EXISTS, {"n": name}).scalar():
        return name  # already there: don't take the table lock CREATE INDEX needs
    # concurrent IF NOT EXISTS can still collide in pg_class: one creator per index name at a time
    conn.execute(_BUILDER_LOCK, {"n": name})
    again = vector_index_for(conn, table, model, int(dims))
    if again != name:  # another model of the same slug took the readable name meanwhile
        name = again
        conn.execute(_BUILDER_LOCK, {"n": name})
    if conn.execute(_EXISTS, {"n": name}).scalar():
        return name
    conn.execute(text(_create_vector_index_sql(name, table, model, int(dims), concurrently=False)))
    return name


_INDEX_VALID = text("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:n)")


def ensure_vector_index_concurrently(engine: Engine, table: str, model: str, dims: int) -> bool:
    """Build the per-model partial HNSW index if missing, ``CREATE INDEX CONCURRENTLY`` on a
    connection of its own; True once it is valid, False when another process is building it (not
    waited for: rows written meanwhile are in that build).

    What the first vector of a new model (a model change) runs, in a worker's completion. A plain
    CREATE INDEX (:func:`ensure_vector_index`) holds a SHARE lock on the whole table while it scans
    every row of every model — every tenant's embedding writes queued behind it (failing at the
    lock timeout), and a build past the statement timeout failed and was tried again by the next
    completion. One builder per index name (a session advisory lock, the key
    :func:`ensure_vector_index` takes); an INVALID leftover of a builder that died is dropped and
    built again — only this model's (:func:`vector_index_for`, read again under the lock)."""
    if table not in ("visual_embeddings", "text_embeddings"):
        raise ValueError(f"no vector column on {table}")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for _ in range(2):  # a second look when another model took the readable name meanwhile
            name = vector_index_for(conn, table, model, int(dims))
            if conn.execute(_INDEX_VALID, {"n": name}).scalar() is True:
                return True
            if not conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:n))"), {"n": name}).scalar():
                return False
            try:
                if vector_index_for(conn, table, model, int(dims)) != name:
                    continue  # (the lock is released below)
                valid = conn.execute(_INDEX_VALID, {"n": name}).scalar()
                if valid is True:
                    return True
                conn.execute(text("SET statement_timeout = 0"))  # the build scans the whole table
                if valid is False:  # we hold the builders' lock: an interrupted build's leftover
                    conn.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'))
                conn.execute(text(_create_vector_index_sql(name, table, model, int(dims), concurrently=True)))
                return True
            finally:
                try:
                    conn.execute(text("RESET statement_timeout"))
                    conn.execute(text("SELECT pg_advisory_unlock(hashtext(:n))"), {"n": name})
                except Exception:  # noqa: BLE001 - a broken connection released the lock with its session
                    conn.invalidate()
        return False


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


class ExtensionUnavailable(RuntimeError):
    """A migration's ``CREATE EXTENSION`` failed: the role may not create it (pgvector's ``vector``
    is not a trusted extension: only a superuser may), or the server does not have it installed.
    The message says what a DBA must run."""


_CREATE_EXTENSION = re.compile(r"CREATE EXTENSION IF NOT EXISTS (\w+)", re.IGNORECASE)
#: Every extension the migrations create, for the DBA to create at once.
MIGRATION_EXTENSIONS = ("vector", "btree_gin")


#: How long a migration statement waits for a table lock before the upgrade rolls back and tries
#: again (ms), and how many tries. Live traffic queues behind a waiting ALTER: a rolling upgrade
#: run behind a long transaction stalled every statement on that table for as long as it ran. So a
#: wait is cut short; the traffic goes on; the next try comes after a pause (the whole upgrade is
#: one transaction: nothing is half applied). About MIGRATE_LOCK_TRIES × (5 + 3) s in all.
MIGRATE_LOCK_TIMEOUT_MS = 5000
MIGRATE_LOCK_TRIES = 40
MIGRATE_LOCK_PAUSE_S = 3.0
_LOCK_NOT_AVAILABLE = "55P03"


def sqlstate(orig: BaseException | None) -> str | None:
    """The SQLSTATE of a driver exception: psycopg's ``sqlstate``, psycopg2's ``pgcode`` (the
    migrations' driver); None when the server said nothing (a connection that failed)."""
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def upgrade_to_head(url: str, on_wait: Callable[[str], None] | None = None) -> None:
    """``alembic upgrade head``; :class:`ExtensionUnavailable` (what to ask the DBA for) when a
    migration cannot create an extension. A migration that waited ``MIGRATE_LOCK_TIMEOUT_MS`` for a
    table lock (live traffic's long transaction) is rolled back and tried again, up to
    ``MIGRATE_LOCK_TRIES`` times; ``on_wait`` (and the log) is told each time."""
    from alembic import command
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    try:
        for tries_left in range(MIGRATE_LOCK_TRIES - 1, -1, -1):
            try:
                command.upgrade(alembic_config(url), "head")
                break
            except DBAPIError as exc:
                if sqlstate(exc.orig) != _LOCK_NOT_AVAILABLE or not tries_left:
                    raise
                message = (f"a migration waited {MIGRATE_LOCK_TIMEOUT_MS / 1000:g} s for a table lock held by a "
                           f"long transaction; rolled back so live traffic is not held up, trying again in "
                           f"{MIGRATE_LOCK_PAUSE_S:g} s ({tries_left} tries left)")
                log.warning("%s", message)
                if on_wait is not None:
                    on_wait(message)
                time.sleep(MIGRATE_LOCK_PAUSE_S)
        require_pgvector(url)
    except DBAPIError as exc:
        found = _CREATE_EXTENSION.search(exc.statement or "")
        if found is None:
            raise
        name = found.group(1)
        reason = (str(exc.orig).strip().splitlines() or [""])[0]
        database = make_url(url).database
        statements = " ".join(f"CREATE EXTENSION IF NOT EXISTS {e};" for e in MIGRATION_EXTENSIONS)
        raise ExtensionUnavailable(
            f"cannot create the PostgreSQL extension {name!r} ({reason}). As a superuser, in database "
            f"{database!r}, run: {statements} (pgvector must be installed on the server); then run "
            "`memeflow db upgrade` again") from None


#: The oldest pgvector memeflow runs on: searches set ``hnsw.iterative_scan`` (pgvector 0.8.0), which
#: an older pgvector refuses as an unknown parameter.
MIN_PGVECTOR = (0, 8, 0)
_PGVECTOR_VERSION = text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def require_pgvector(url: str) -> None:
    """Raise :class:`ExtensionUnavailable` (what to do) when the database's pgvector is older than
    :data:`MIN_PGVECTOR`: every semantic and look-alike search would fail on it."""
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            version = conn.execute(_PGVECTOR_VERSION).scalar()
    finally:
        engine.dispose()
    if version is not None and _version_tuple(version) < MIN_PGVECTOR:
        from sqlalchemy.engine import make_url

        need = ".".join(map(str, MIN_PGVECTOR))
        raise ExtensionUnavailable(
            f"the database {make_url(url).database!r} has pgvector {version}; memeflow needs {need} or newer "
            f"(its searches use iterative HNSW scans). Install pgvector >= {need} on the server, then as a "
            "superuser run: ALTER EXTENSION vector UPDATE; and run `memeflow db upgrade` again")


def migration_status(conn: Connection) -> tuple[str | None, str]:
    """(current revision in the database, head revision of the code)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(str(conn.engine.url)))
    current = MigrationContext.configure(conn).get_current_revision()
    return current, script.get_current_head() or ""


class SchemaBehind(RuntimeError):
    """The database is not migrated up to the code's head (a worker would fail every statement
    that touches what the missing migrations add)."""


def schema_check(conn: Connection) -> tuple[str, str | None, str]:
    """How the database's migration revision relates to the code's: ``(state, current, head)``
    with ``state`` ``at_head``; ``behind`` (never migrated, or at an older revision of the code's
    history: ``memeflow db upgrade`` is needed); or ``ahead`` (a revision this code does not know:
    a newer release migrated it, as during a rolling upgrade)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

    script = ScriptDirectory.from_config(alembic_config(str(conn.engine.url)))
    head = script.get_current_head() or ""
    current = MigrationContext.configure(conn).get_current_revision()
    if current == head:
        return "at_head", current, head
    if current is None:
        return "behind", current, head
    try:
        script.get_revision(current)
    except CommandError:  # not in this code's history: a newer release's
        return "ahead", current, head
    return "behind", current, head


def require_schema_not_behind(url: str) -> str:
    """Raise :class:`SchemaBehind` (with what to run) when the database at ``url`` is not migrated
    up to the code's head; return the state (``at_head`` or ``ahead``) otherwise."""
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            state, current, head = schema_check(conn)
    finally:
        engine.dispose()
    if state == "behind":
        raise SchemaBehind(
            f"the database is at migration {current or '(none: never migrated)'}, this code needs {head}: "
            "run `memeflow db upgrade` first (docker compose: the `migrate` service)")
    return state
