"""The sweep's side of the search serving states (migrations 0017, 0025): which rows it attends to
next, and how long its configuration has disagreed with a row's.

Every process reads the configured model from its own settings, so during a rolling restart old- and
new-configuration sweeps both run. Each acts on a disagreement between its configured model and a
row's direction (the serving model; the target during a backfill) only once the disagreement has
lasted ``MEMEFLOW_SEARCH_CONFIG_GRACE_S`` with no agreeing sweep in between: an agreeing sweep clears
it (``clear_disagreement_txn``), a disagreeing one notes it (``note_disagreement_txn``, the row locked
until the caller's action commits), and every switch of direction (store/serving.py) clears it too.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import Outcome, sql, transition

ATTEND = sql("""
WITH picked AS (
  SELECT scope_id FROM search_serving
  WHERE kind = :k AND (state = 'backfill'
    OR (state = 'serving' AND (serving_model <> :m OR serving_dims <> :d
        OR coalesce(serving_ref->>'preprocess_version', '') <> coalesce(CAST(:p AS text), ''))))
  ORDER BY attended_at NULLS FIRST, scope_id LIMIT :n FOR UPDATE SKIP LOCKED)
UPDATE search_serving ss SET attended_at = :now FROM picked
WHERE ss.scope_id = picked.scope_id AND ss.kind = :k
RETURNING ss.*
""")


@transition
def attend_txn(conn: Connection, kind: str, ref: dict[str, Any], limit: int, now: datetime) -> Outcome[RowMapping]:
    """Rows the sweep must act on, attended now: in backfill, or served by a model other than the
    configured ``ref`` (and not pinned by an operator).

    Least recently attended first, so with more than ``limit`` such scopes each gets its turn (a
    scope whose fill batch is still seeding is looked at without being checked: ``checked_at`` would
    give it every turn); rows another sweep holds are skipped, not waited for."""
    return Outcome.of(conn.execute(ATTEND, {
        "k": kind, "m": ref["model"], "d": int(ref["dims"]), "p": ref.get("preprocess_version"), "n": limit,
        "now": now,
    }).mappings().all())


def disagreement_key(ref: dict[str, Any]) -> str:
    """What a configuration disagrees towards: the identity of the configured model's rows."""
    return json.dumps({"model": str(ref["model"]), "dims": int(ref["dims"]),
                       "preprocess_version": ref.get("preprocess_version")}, sort_keys=True)


# A sweep configured with the model a row is heading for — its serving model, or its target during a
# backfill — clears the disagreement other sweeps noted: the grace starts again when they next disagree.
CLEAR_DISAGREEMENT = sql("""
UPDATE search_serving SET config_disagree_since = NULL, config_disagree_ref = NULL
WHERE kind = :k AND config_disagree_since IS NOT NULL
  AND ((state = 'serving' AND serving_model = :m AND serving_dims = :d
        AND coalesce(serving_ref->>'preprocess_version', '') = coalesce(CAST(:p AS text), ''))
    OR (state = 'backfill' AND target_model = :m AND target_dims = :d
        AND coalesce(target_ref->>'preprocess_version', '') = coalesce(CAST(:p AS text), '')))
""")


@transition
def clear_disagreement_txn(conn: Connection, kind: str, ref: dict[str, Any]) -> Outcome[None]:
    """disagreement noted → none, on every row of ``kind`` heading for the configured ``ref``."""
    return Outcome.count(conn.execute(CLEAR_DISAGREEMENT, {
        "k": kind, "m": ref["model"], "d": int(ref["dims"]), "p": ref.get("preprocess_version"),
    }).rowcount)


# The row's direction as the sweep read it (state, epoch, serving and target) is in the WHERE clause:
# a row that moved meanwhile is noted by a later sweep, against what it is then. The same disagreement
# keeps its start; one towards another model starts again.
NOTE_DISAGREEMENT = sql("""
UPDATE search_serving SET config_disagree_ref = CAST(:to AS jsonb),
       config_disagree_since = CASE WHEN config_disagree_ref = CAST(:to AS jsonb) THEN config_disagree_since
                                    ELSE :now END
WHERE scope_id = :s AND kind = :k AND state = :st AND epoch = :e AND serving_model = :sm
  AND target_model IS NOT DISTINCT FROM CAST(:tm AS text)
RETURNING *, (:grace <= 0 OR config_disagree_since <= :now - make_interval(secs => :grace)) AS due
""")


@transition
def note_disagreement_txn(conn: Connection, row: Any, towards: dict[str, Any], now: datetime,
                          grace_s: float) -> Outcome[RowMapping]:
    """disagreement noted (since now, unless already noted towards ``towards``): a sweep configured
    with ``towards`` disagrees with ``row``'s direction. The returned row's ``due``: it has lasted
    ``grace_s``, and the caller may act on it in this transaction (the row is locked).

    Not matched: the row moved since it was read — nothing to note."""
    return Outcome.of(conn.execute(NOTE_DISAGREEMENT, {
        "s": row["scope_id"], "k": row["kind"], "st": row["state"], "e": row["epoch"], "sm": row["serving_model"],
        "tm": row["target_model"], "to": disagreement_key(towards), "now": now, "grace": float(grace_s),
    }).mappings().all())
