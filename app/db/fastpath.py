"""The store's statements executed straight on the psycopg cursor (issue 21: the no-op pipeline).

``FastConnection.execute`` runs a statement parsed by ``store._sql.sql`` — a plain text clause
with named binds and one set of parameters — without SQLAlchemy's per-execution machinery
(execution context, compiled-cache lookup, cursor-result set-up), which cost ≈ 40–70 µs of worker
CPU per statement against ≈ 15–20 µs for the cursor itself. Everything else stays SQLAlchemy's:
the transaction (the same DBAPI connection, autobegun as SQLAlchemy does), errors (wrapped and
the connection invalidated on a disconnect by SQLAlchemy's own handler, so
``execution.retry_on_disconnect`` sees the same ``DBAPIError``), and the result API (an
``IteratorResult`` of real ``Row`` objects: ``mappings()``, ``scalars()``, ``first()``,
``rowcount`` …). The SQL sent is the statement SQLAlchemy compiles for psycopg, compiled once;
a non-empty list of UUIDs is bound in binary (psycopg's text dump of a UUID array costs ≈ 50 µs
for 32 ids, binary ≈ 15 µs). Any statement the fast path does not know — an ORM or Core
construct, executemany, statement or connection execution options, echo — and every execution
while an event listener is registered on the engine or connection (tests that capture
statements) takes SQLAlchemy's ordinary path, so listeners see every statement.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.pq import ExecStatus
from sqlalchemy.engine import Connection
from sqlalchemy.engine.result import IteratorResult, SimpleResultMetaData
from sqlalchemy.sql.elements import TextClause

#: Set on a TextClause by ``store._sql.sql``: the fast path may run it.
FAST_ATTR = "_memeflow_fast"
_COMPILED_ATTR = "_memeflow_compiled"

_NO_ROWS = SimpleResultMetaData(())
_metadata: dict[tuple[str, ...], SimpleResultMetaData] = {}


class _Result(IteratorResult):
    """An ``IteratorResult`` that also carries the cursor's ``rowcount``."""

    rowcount: int = -1


_TUPLES = tuple(getattr(ExecStatus, name) for name in ("TUPLES_OK", "SINGLE_TUPLE", "TUPLES_CHUNK")
                if hasattr(ExecStatus, name))


def _column_names(cursor: Any) -> tuple[str, ...] | None:
    """The names of the result's columns, or None if it returned no tuples — what
    ``cursor.description`` says, without building its ``Column`` objects (a type lookup per
    column of every result: ≈ 10 µs per column, 2 ms of API CPU per upload; docs/performance-log.md §24)."""
    res = getattr(cursor, "pgresult", cursor)
    if res is cursor:  # not a psycopg 3 cursor: its description then
        description = cursor.description
        return None if description is None else tuple(d.name for d in description)
    if not res or not (res.nfields or res.status in _TUPLES):
        return None
    encoding = getattr(cursor, "_encoding", None) or cursor.connection.info.encoding
    names = []
    for i in range(res.nfields):
        fname = res.fname(i)
        names.append(fname.decode(encoding) if fname else f"column_{i + 1}")
    return tuple(names)


def mark_fast(clause: TextClause) -> TextClause:
    setattr(clause, FAST_ATTR, True)
    return clause


def _compiled(conn: Connection, clause: TextClause, binary: tuple[str, ...]) -> str:
    cache = getattr(clause, _COMPILED_ATTR, None)
    if cache is None:
        cache = {}
        setattr(clause, _COMPILED_ATTR, cache)
    key = (conn.dialect.name, binary)
    query = cache.get(key)
    if query is None:
        query = str(clause.compile(dialect=conn.dialect))
        for name in binary:
            query = query.replace(f"%({name})s", f"%({name})b")
        cache[key] = query
    return query


#: The private SQLAlchemy methods ``FastConnection`` calls, checked at import (and exercised
#: against the installed version by tests/db/test_fastpath.py): a release without them gets the
#: ordinary execution path instead of an error.
SUPPORTED = all(hasattr(Connection, name) for name in ("_revalidate_connection", "_autobegin",
                                                       "_handle_dbapi_exception"))


class FastConnection(Connection):
    """A Connection that runs the store's parsed statements on the raw cursor (module docstring)."""

    def execute(self, statement, parameters=None, *, execution_options=None):  # type: ignore[override]
        if (
            execution_options
            or getattr(statement, FAST_ATTR, False) is not True
            or not (parameters is None or type(parameters) is dict)
            or self._has_events
            or self.engine._has_events
            or self._echo
            or statement._execution_options
            or (self._execution_options and set(self._execution_options) - {"isolation_level"})
            or (self._transaction is not None and not self._transaction.is_active)
            or self._nested_transaction is not None
        ):
            return super().execute(statement, parameters, execution_options=execution_options)
        return self._fast_execute(statement, parameters or {})

    def _fast_execute(self, clause: TextClause, params: dict[str, Any]) -> _Result:
        binary = tuple(
            name for name, value in params.items()
            if type(value) is list and value and type(value[0]) is uuid.UUID
        )
        query = _compiled(self, clause, binary)
        dbapi = self._dbapi_connection
        if dbapi is None:
            dbapi = self._revalidate_connection()
        if self._transaction is None:
            self._autobegin()
        cursor = None
        try:
            cursor = dbapi.cursor()
            cursor.execute(query, params)
            keys = _column_names(cursor)
            rows = cursor.fetchall() if keys is not None else ()
            rowcount = cursor.rowcount
            cursor.close()
        except BaseException as e:  # noqa: BLE001 - wrapped (and the connection invalidated) as SQLAlchemy does
            self._handle_dbapi_exception(e, query, params, cursor, None)
        if keys is None:
            metadata = _NO_ROWS
        else:
            metadata = _metadata.get(keys)
            if metadata is None:
                metadata = _metadata[keys] = SimpleResultMetaData(keys)
        result = _Result(metadata, iter(rows))
        result.rowcount = rowcount
        return result
