"""Parsed SQL statements, cached: building a ``text()`` clause re-parses its bind parameters on
every call, which showed up in profiles of the worker hot path."""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import TextClause, text


@lru_cache(maxsize=1024)
def sql(statement: str) -> TextClause:
    return text(statement)
