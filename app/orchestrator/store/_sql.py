"""The store's building blocks: parsed statements, the typed outcome of a transition, and the
registry of named transitions (docs/architecture.md "Transitions and the condition each checks";
tests/unit/test_transition_table.py keeps the two equal).

Every statement is a module-level constant written out whole next to the function that runs it —
never assembled from fragments at call time — so the SQL that runs is the SQL you read. The four
with a part per stage (store/facts.py, the batched claims in store/tasks.py) take it from the stage
registry once, at import, and are checked in rendered as docs/sql/*.sql (tests/unit/test_stage_sql.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

from sqlalchemy import TextClause, text

from app.db.fastpath import mark_fast

T = TypeVar("T")
F = TypeVar("F", bound=Callable)


@lru_cache(maxsize=1024)
def sql(statement: str) -> TextClause:
    """Parse ``statement`` once (``text()`` re-parses its bind parameters on every call, which
    showed up in profiles of the worker hot path), marked for ``app.db.fastpath``: a connection
    of ``make_engine`` runs it on the psycopg cursor without SQLAlchemy's execution overhead."""
    return mark_fast(text(statement))


class InvariantBroken(RuntimeError):
    """A transition matched nothing although the caller held its row locked in the from-status."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a transition did: ``matched`` — its WHERE clause held for at least one row — the rows
    it returned, and how many rows it changed. A caller decides what "not matched" means (fencing rejection, lost race,
    nothing to do); using an Outcome as a truth value is an error, so that decision is never
    skipped by accident."""

    matched: bool
    rows: tuple[T, ...] = ()
    #: how many rows the transition changed (``count``) or returned (``of``)
    affected: int = 0

    @property
    def row(self) -> T | None:
        """The first returned row (None when nothing matched)."""
        return self.rows[0] if self.rows else None

    @classmethod
    def of(cls, rows: Iterable[T]) -> Outcome[T]:
        """Matched when at least one row came back."""
        rows = tuple(rows)
        return cls(bool(rows), rows, len(rows))

    @classmethod
    def count(cls, rowcount: int) -> Outcome[T]:
        """Matched when the statement touched at least one row (no RETURNING)."""
        return cls(rowcount > 0, (), max(rowcount, 0))

    def expect(self, why: str) -> Outcome[T]:
        """Self when matched; else raise ``InvariantBroken``: for a transition whose row the caller
        holds locked in its from-status (``why`` says so), "not matched" means an invariant broke
        — the transaction must not go on as if it had landed."""
        if not self.matched:
            raise InvariantBroken(f"transition matched nothing although {why}")
        return self

    def __bool__(self) -> bool:
        raise TypeError("an Outcome is not a truth value: test .matched and handle the other case")


#: ``module.function`` of every named transition in the store → its one-line docstring.
TRANSITIONS: dict[str, str] = {}


def transition(fn: F) -> F:
    """Register ``fn`` as a named state transition of the store (its docstring's first line is
    what the transition does; docs/architecture.md's table must name it)."""
    module = fn.__module__.rsplit(".", 1)[-1]
    doc = (fn.__doc__ or "").strip().splitlines()
    if not doc:
        raise ValueError(f"transition {module}.{fn.__name__} needs a docstring")
    TRANSITIONS[f"{module}.{fn.__name__}"] = doc[0]
    return fn
