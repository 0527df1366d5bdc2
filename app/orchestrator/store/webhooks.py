"""Webhook subscriptions: create/list/delete, and the delivery lane's claim and fenced transitions.

A subscription is its own little queue: the events of its scope (of its types) after ``cursor``.
The lane claims a subscription like a leaf task — one conditional UPDATE that bumps
``claim_generation`` and sets ``lease_owner``/``lease_expires_at`` — and every later write of that
claim is conditioned on (id, lease_owner, claim_generation); zero rows = fencing rejection.
Only one claim delivers at a time and the cursor moves only after an event's outcome is final, so
a subscription's events go out in id order, the next only after the previous one succeeded or
was given up.

The lane is shared fairly between scopes (docs/events.md "Sharing the lane"): a subscription is
*waiting* when it is due, unleased and has an event to deliver, and a scope's *in flight* is its
count of live leases. A claim is admitted only while its scope has no more in flight than the
least-served scope with a waiting subscription (CLAIM), hints go to the least-served scopes first,
one subscription of each in turn (DUE_FOR_HINT), and a claim whose scope has two or more in flight
above that hands over between deliveries (FAIRER_SCOPE_WAITING, HAND_OVER).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition

# A subscription has an event to deliver (ix_events_scope_id range from its cursor) — the predicate
# CLAIM and HAS_DUE spell out in full (tests/unit/test_transition_table.py checks they agree).
HAS_PENDING = (
    "EXISTS (SELECT 1 FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor"
    " AND e.type = ANY(s.event_types))"
)

# Subscription w is waiting: due, unleased (or its lease expired), an event to deliver — what a claim
# of it would find (CLAIM's own conditions); spelled out in CLAIM, DUE_FOR_HINT and
# FAIRER_SCOPE_WAITING (tests/unit/test_transition_table.py).
WAITING = (
    "w.next_attempt_at <= :now AND (w.lease_expires_at IS NULL OR w.lease_expires_at < :now)"
    " AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = w.scope_id AND e.id > w.cursor"
    " AND e.type = ANY(w.event_types))"
)

# The deliveries in flight of w's scope: its subscriptions under a live lease (ix_webhook_subscriptions_scope_id).
IN_FLIGHT = "(SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = w.scope_id AND l.lease_expires_at >= :now)"


def lock_scope_txn(conn: Connection, scope_id: str) -> None:
    """Serialise subscription creations of a scope (to the end of the transaction)."""
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtextextended('webhooks:' || :s, 0))"), {"s": scope_id})


def count_txn(conn: Connection, scope_id: str) -> int:
    return conn.execute(
        sql("SELECT count(*) FROM webhook_subscriptions WHERE scope_id = :s"), {"s": scope_id}
    ).scalar_one()


#: The channel a new subscription is announced on (the webhooks workers' hint pollers LISTEN on it
#: and sleep while no subscription exists: app/worker/webhooks.py).
CHANNEL = "memeflow_webhooks"
NOTIFY_CREATED = sql("SELECT pg_notify('memeflow_webhooks', '')")  # CHANNEL
ANY_SUBSCRIPTION = sql("SELECT EXISTS (SELECT 1 FROM webhook_subscriptions)")


def notify_created_txn(conn: Connection) -> None:
    """Wake the sleeping hint pollers when this transaction commits (PostgreSQL delivers a
    NOTIFY at commit, and never for a rolled-back transaction)."""
    conn.execute(NOTIFY_CREATED)


def any_subscription_txn(conn: Connection) -> bool:
    return bool(conn.execute(ANY_SUBSCRIPTION).scalar_one())


# A new subscription, returning its public columns (never the secret).
INSERT_SUBSCRIPTION = sql("""
INSERT INTO webhook_subscriptions (id, scope_id, url, event_types, secret, cursor, next_attempt_at, created_at)
VALUES (:id, :s, :u, :t, :sec, :c, :now, :now)
RETURNING id, scope_id, url, event_types, cursor, attempts, next_attempt_at, delivered_count, failed_count,
          last_error, last_delivery_at, created_at
""")


def insert_txn(
    conn: Connection, scope_id: str, url: str, event_types: list[str], secret: str, cursor: int, now: datetime
) -> RowMapping:
    return conn.execute(
        INSERT_SUBSCRIPTION,
        {"id": uuid.uuid4(), "s": scope_id, "u": url, "t": event_types, "sec": secret, "c": cursor, "now": now},
    ).mappings().one()


# A scope's subscriptions, oldest first: the columns INSERT_SUBSCRIPTION returns.
LIST_SUBSCRIPTIONS = sql("""
SELECT id, scope_id, url, event_types, cursor, attempts, next_attempt_at, delivered_count, failed_count,
       last_error, last_delivery_at, created_at
FROM webhook_subscriptions WHERE scope_id = :s ORDER BY created_at, id
""")


def list_txn(conn: Connection, scope_id: str) -> list[RowMapping]:
    return list(conn.execute(LIST_SUBSCRIPTIONS, {"s": scope_id}).mappings())


DELETE_SUBSCRIPTION = sql("DELETE FROM webhook_subscriptions WHERE id = :id AND scope_id = :s")
# A DELETE waits for a delivery in flight (NEXT_EVENT's row lock, held for at most the delivery
# timeout: the name is resolved before the lock, and everything under it is bounded by the
# exchange's deadline): the transaction's lock_timeout outlasts it, whatever
# MEMEFLOW_WEBHOOK_TIMEOUT_S is, by DELETE_WAIT_MARGIN_S (a pause, a slow commit). Past it the
# DELETE is answered WebhookDeliveryInFlight (app/orchestrator/webhooks.py).
WAIT_FOR_DELIVERY = sql("SELECT set_config('lock_timeout', :ms, true)")
DELETE_WAIT_MARGIN_S = 10.0


@transition
def delete_txn(conn: Connection, scope_id: str, sub_id: uuid.UUID, delivery_timeout_s: float) -> Outcome[None]:
    """subscription of the scope → deleted, after any delivery in flight to it ended (it holds the
    row FOR KEY SHARE); a claim between deliveries is fenced out by the row's absence. Not matched:
    no such subscription in the scope. A delivery still holding the row after ``delivery_timeout_s``
    + ``DELETE_WAIT_MARGIN_S`` raises the driver's lock_not_available (55P03)."""
    conn.execute(WAIT_FOR_DELIVERY, {"ms": str(max(1, int((delivery_timeout_s + DELETE_WAIT_MARGIN_S) * 1000)))})
    return Outcome.count(conn.execute(DELETE_SUBSCRIPTION, {"id": sub_id, "s": scope_id}).rowcount)


CLAIM = sql("""
UPDATE webhook_subscriptions s SET lease_owner = :o, lease_expires_at = :exp,
       claim_generation = s.claim_generation + 1, last_hint_at = NULL
WHERE s.id = :id AND s.next_attempt_at <= :now AND (s.lease_expires_at IS NULL OR s.lease_expires_at < :now)
  AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor
              AND e.type = ANY(s.event_types))
  AND ((SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = s.scope_id AND l.lease_expires_at >= :now) = 0
       OR (SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = s.scope_id AND l.lease_expires_at >= :now)
          <= (SELECT min((SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = w.scope_id
                                                                        AND l.lease_expires_at >= :now))
              FROM webhook_subscriptions w
              WHERE w.next_attempt_at <= :now AND (w.lease_expires_at IS NULL OR w.lease_expires_at < :now)
                AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = w.scope_id AND e.id > w.cursor
                            AND e.type = ANY(w.event_types))))
RETURNING s.*
""")


@transition
def claim_txn(conn: Connection, sub_id: uuid.UUID, owner: str, now: datetime, lease_s: float) -> Outcome[RowMapping]:
    """due, unleased (or lease expired), an event after its cursor, its scope no more in flight than
    any scope waiting → leased, generation + 1.

    The last condition is the lane's fairness: a scope with nothing in flight is always admitted
    (the OR's first arm spares it the walk over waiting subscriptions); one with more than the
    least-served waiting scope is refused. Not matched: a stale, duplicate or unknown hint, nothing
    due, or refused."""
    return Outcome.of(conn.execute(
        CLAIM, {"id": sub_id, "o": owner, "now": now, "exp": now + timedelta(seconds=lease_s)}
    ).mappings().all())


CLEAR_HINT = sql("""
UPDATE webhook_subscriptions SET last_hint_at = NULL
WHERE id IN (SELECT id FROM webhook_subscriptions WHERE id = :id
             AND (lease_expires_at IS NULL OR lease_expires_at < :now) FOR UPDATE SKIP LOCKED)
""")


def clear_hint_txn(conn: Connection, sub_id: uuid.UUID, now: datetime) -> None:
    """A hint naming ``sub_id`` was spent without a claim (refused, or nothing due): the
    subscription waits unhinted, so the poller (or a hand-over) hints it again once it is its turn
    — not only after ``rehint_grace_s``. A leased row, or one another transaction holds, is left."""
    conn.execute(CLEAR_HINT, {"id": sub_id, "now": now})


# -- next_event: the claim's next event, read through the fence and holding the subscription --
# Only while the claim still holds the subscription (id, lease_owner, claim_generation): a deleted
# subscription or a lost lease reads nothing. FOR KEY SHARE OF s keeps the row from being deleted
# until the caller's transaction ends (the delivery's POST runs inside it): a DELETE waits for a
# delivery in flight. It blocks nothing else of the lane (its UPDATEs take FOR NO KEY UPDATE).
# Its ``attempts`` is the subscription's own count for that event (a prune since the claim reset it).
NEXT_EVENT = sql("""
SELECT e.id, e.scope_id, e.type, e.job_id, e.image_id, e.batch_id, e.payload, e.created_at, s.attempts
FROM webhook_subscriptions s JOIN events e ON e.scope_id = s.scope_id AND e.id > :after
 AND e.type = ANY(s.event_types)
WHERE s.id = :id AND s.lease_owner = :o AND s.claim_generation = :g
ORDER BY e.id LIMIT 1
FOR KEY SHARE OF s
""")


def next_event_txn(conn: Connection, sub_id: uuid.UUID, owner: str, generation: int, after: int
                   ) -> RowMapping | None:
    """The claim's first event after ``after`` (of the subscription's scope and types) with the
    subscription's ``attempts`` (failures already spent on it), the subscription row share-locked
    against deletion to the end of the transaction; None when nothing is due or the claim was
    fenced out (deleted, lease lost)."""
    return conn.execute(NEXT_EVENT, {"id": sub_id, "o": owner, "g": generation, "after": after}).mappings().first()


# A delivered event whose cursor is past it already was pruned by retention during the POST
# (events.PRUNE_EVENTS takes FOR NO KEY UPDATE, which the POST's FOR KEY SHARE does not block): the
# prune accounted for it (events_expired, attempts 0 for the next event), so only the lease is
# extended — the claim goes on, it is not fenced out.
DELIVERED = sql("""
UPDATE webhook_subscriptions SET cursor = greatest(cursor, :e),
       attempts = CASE WHEN cursor < :e THEN 0 ELSE attempts END,
       delivered_count = delivered_count + CASE WHEN cursor < :e THEN 1 ELSE 0 END,
       last_delivery_at = :now, last_error = CASE WHEN cursor < :e THEN NULL ELSE last_error END,
       lease_expires_at = :exp
WHERE id = :id AND lease_owner = :o AND claim_generation = :g
""")


@transition
def delivered_txn(
    conn: Connection, sub_id: uuid.UUID, owner: str, generation: int, event_id: int, now: datetime, lease_s: float
) -> Outcome[None]:
    """leased → leased, cursor past the delivered event (unless a prune moved it past already),
    lease extended (fenced). Not matched: fenced out."""
    return Outcome.count(conn.execute(DELIVERED, {
        "id": sub_id, "o": owner, "g": generation, "e": event_id, "now": now, "exp": now + timedelta(seconds=lease_s),
    }).rowcount)


# attempts count the failures of the event after the cursor: a prune that moved the cursor past
# the failed event during its POST reset them for the next one, and they stay reset.
RETRY_LATER = sql("""
UPDATE webhook_subscriptions SET attempts = CASE WHEN cursor < :e THEN :a ELSE 0 END, next_attempt_at = :at,
       last_error = CAST(:err AS jsonb), lease_owner = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_owner = :o AND claim_generation = :g
""")


@transition
def retry_later_txn(
    conn: Connection, sub_id: uuid.UUID, owner: str, generation: int, event_id: int, attempts: int, at: datetime,
    error: dict[str, Any],
) -> Outcome[None]:
    """leased → unleased, due again at ``at`` after event ``event_id`` failed ``attempts`` times;
    the cursor stays (fenced). Not matched: fenced out."""
    return Outcome.count(conn.execute(RETRY_LATER, {
        "id": sub_id, "o": owner, "g": generation, "e": event_id, "a": attempts, "at": at,
        "err": canonical_json(error),
    }).rowcount)


# The row is locked first so the cursor compared is its current one (a prune during the POST may
# have moved it past the event: then the prune recorded the event, and this records nothing).
GAVE_UP = sql("""
WITH b AS (
  SELECT id, cursor FROM webhook_subscriptions WHERE id = :id AND lease_owner = :o AND claim_generation = :g
  FOR NO KEY UPDATE
)
UPDATE webhook_subscriptions s SET cursor = greatest(b.cursor, :e),
       attempts = CASE WHEN b.cursor < :e THEN 0 ELSE s.attempts END,
       failed_count = s.failed_count + CASE WHEN b.cursor < :e THEN 1 ELSE 0 END,
       last_error = CASE WHEN b.cursor < :e THEN CAST(:err AS jsonb) ELSE s.last_error END, lease_expires_at = :exp
FROM b WHERE s.id = b.id
RETURNING s.scope_id, b.cursor < :e AS recorded
""")

INSERT_FAILURE = sql("""
INSERT INTO webhook_failures (scope_id, subscription_id, event_id, attempts, error, failed_at)
VALUES (:s, :id, :e, :a, CAST(:err AS jsonb), :now)
""")


@transition
def gave_up_txn(
    conn: Connection, sub_id: uuid.UUID, owner: str, generation: int, event_id: int, attempts: int,
    error: dict[str, Any], now: datetime, lease_s: float,
) -> Outcome[bool]:
    """leased → leased, the event recorded failed and the cursor past it (fenced); an event a prune
    moved the cursor past during its POST is recorded already (events_expired): lease extended
    only. ``row``: whether this recorded it. Not matched: fenced out."""
    moved = Outcome.of(conn.execute(GAVE_UP, {
        "id": sub_id, "o": owner, "g": generation, "e": event_id, "err": canonical_json(error),
        "exp": now + timedelta(seconds=lease_s),
    }).mappings().all())
    if moved.matched and moved.row["recorded"]:
        conn.execute(INSERT_FAILURE, {"s": moved.row["scope_id"], "id": sub_id, "e": event_id, "a": attempts,
                                      "err": canonical_json(error), "now": now})
    return Outcome.of(r["recorded"] for r in moved.rows)


RELEASE = sql("""
UPDATE webhook_subscriptions SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_owner = :o AND claim_generation = :g
""")


@transition
def release_txn(conn: Connection, sub_id: uuid.UUID, owner: str, generation: int) -> Outcome[None]:
    """leased → unleased (the worker stops early; fenced). Not matched: the lease was lost already."""
    return Outcome.count(conn.execute(RELEASE, {"id": sub_id, "o": owner, "g": generation}).rowcount)


HAND_OVER = sql("""
UPDATE webhook_subscriptions SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = :now
WHERE id = :id AND lease_owner = :o AND claim_generation = :g
""")


@transition
def hand_over_txn(conn: Connection, sub_id: uuid.UUID, owner: str, generation: int, now: datetime) -> Outcome[None]:
    """leased → unleased with events still due, due since now (fenced).

    ``next_attempt_at = now`` puts it behind the subscriptions of its scope that have waited longer
    (DUE_FOR_HINT takes a scope's waiting subscriptions oldest due first). Not matched: the lease
    was lost already."""
    return Outcome.count(conn.execute(HAND_OVER, {"id": sub_id, "o": owner, "g": generation, "now": now}).rowcount)


# -- fairer_scope_waiting: should a claim hand over between two deliveries --
FAIRER_SCOPE_WAITING = sql("""
SELECT CASE WHEN mine.n < 2 THEN false ELSE coalesce(
  (SELECT min((SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = w.scope_id
                                                            AND l.lease_expires_at >= :now))
   FROM webhook_subscriptions w
   WHERE w.next_attempt_at <= :now AND (w.lease_expires_at IS NULL OR w.lease_expires_at < :now)
     AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = w.scope_id AND e.id > w.cursor
                 AND e.type = ANY(w.event_types))) + 2 <= mine.n, false) END
FROM (SELECT count(*) AS n FROM webhook_subscriptions l WHERE l.scope_id = :s AND l.lease_expires_at >= :now) mine
""")


def fairer_scope_waiting_txn(conn: Connection, scope_id: str, now: datetime) -> bool:
    """Whether a scope with at least two fewer deliveries in flight than ``scope_id`` waits: then
    one of ``scope_id``'s claims should hand over (two, so that handing over evens the two out
    instead of swapping them). Scopes with fewer than two in flight answer without the walk."""
    return bool(conn.execute(FAIRER_SCOPE_WAITING, {"s": scope_id, "now": now}).scalar_one())


# -- has_due: does any subscription have an event to deliver now (the lane's "queued work") --
HAS_DUE = sql("""
SELECT EXISTS (SELECT 1 FROM webhook_subscriptions s WHERE s.next_attempt_at <= now()
               AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor
                           AND e.type = ANY(s.event_types)))
""")


def has_due_txn(conn: Connection) -> bool:
    """Whether the webhooks lane has work waiting: a subscription past its backoff with an event
    after its cursor (one probe of ``ix_events_scope_id`` per subscription until the first)."""
    return bool(conn.execute(HAS_DUE).scalar_one())


HAS_DUE_IN_SCOPE = sql("""
SELECT EXISTS (SELECT 1 FROM webhook_subscriptions s WHERE s.scope_id = :s AND s.next_attempt_at <= now()
               AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor
                           AND e.type = ANY(s.event_types)))
""")


def has_due_in_scope_txn(conn: Connection, scope_id: str) -> bool:
    """:func:`has_due_txn` for one scope's subscriptions (what that scope's /ops may know of)."""
    return bool(conn.execute(HAS_DUE_IN_SCOPE, {"s": scope_id}).scalar_one())


# -- due_for_hint: subscriptions to wake (new events, backoff over, lease expired, hint lost) --
# Only the least-served scopes' (a scope with more in flight would be refused: CLAIM), in turns:
# a scope's k-th waiting subscription (oldest due first) would be its (in flight + k)-th delivery,
# and lower turns go first — one of each scope, then the second of each … — so one scope's many
# subscriptions never queue every hint ahead of another's.
DUE_FOR_HINT = sql("""
WITH waiting AS MATERIALIZED (
  SELECT w.id, w.next_attempt_at, w.last_hint_at,
         (SELECT count(*) FROM webhook_subscriptions l WHERE l.scope_id = w.scope_id AND l.lease_expires_at >= :now)
           AS in_flight,
         row_number() OVER (PARTITION BY w.scope_id ORDER BY w.next_attempt_at, w.id) AS k
  FROM webhook_subscriptions w
  WHERE w.next_attempt_at <= :now AND (w.lease_expires_at IS NULL OR w.lease_expires_at < :now)
    AND EXISTS (SELECT 1 FROM events e WHERE e.scope_id = w.scope_id AND e.id > w.cursor
                AND e.type = ANY(w.event_types))
), picked AS (
  SELECT id, in_flight + k AS turn, next_attempt_at FROM waiting
  WHERE (last_hint_at IS NULL OR last_hint_at < :stale) AND in_flight <= (SELECT min(in_flight) FROM waiting)
  ORDER BY in_flight + k, next_attempt_at, id LIMIT :n
), hinted AS (
  UPDATE webhook_subscriptions s SET last_hint_at = :now FROM picked p
  WHERE s.id = p.id AND s.id IN (SELECT h.id FROM webhook_subscriptions h WHERE h.id IN (SELECT id FROM picked)
        AND (h.last_hint_at IS NULL OR h.last_hint_at < :stale)
        AND (h.lease_expires_at IS NULL OR h.lease_expires_at < :now) FOR UPDATE SKIP LOCKED)
  RETURNING s.id, p.turn, p.next_attempt_at
)
SELECT id FROM hinted ORDER BY turn, next_attempt_at, id
""")


@transition
def due_for_hint_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> Outcome[uuid.UUID]:
    """due, unleased, an event to deliver, hint older than the grace (or none), its scope among the
    least served → hinted now.

    ``rows``: the subscriptions to wake, in turns across scopes — never hinted since their last
    claim, or hinted longer than ``grace_s`` ago (the hint was lost). Not matched: nothing to wake."""
    return Outcome.of(conn.execute(
        DUE_FOR_HINT, {"now": now, "stale": now - timedelta(seconds=grace_s), "n": limit}
    ).scalars().all())


# -- skip_unmatched: move idle filtered subscriptions' cursors past events they do not take --
SKIP_UNMATCHED = sql(
    "UPDATE webhook_subscriptions s SET cursor = coalesce("
    "  (SELECT min(e.id) - 1 FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor"
    "    AND e.type = ANY(s.event_types)),"
    "  (SELECT max(e.id) FROM events e WHERE e.scope_id = s.scope_id AND e.id > s.cursor), s.cursor)"
    " WHERE s.id IN (SELECT id FROM webhook_subscriptions WHERE cardinality(event_types) < :all"
    "  AND (lease_expires_at IS NULL OR lease_expires_at < :now) ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED)"
)


@transition
def skip_unmatched_txn(conn: Connection, all_types: int, now: datetime, limit: int) -> Outcome[None]:
    """unleased, filtered, cursor → just before the next event it takes (or the scope's newest).

    For subscriptions to some types only; safe because a scope's later commits always get larger
    ids — so their "anything due?" probes stay short however many other events pass. ``affected``:
    the subscriptions updated (not matched: no filtered subscription is idle)."""
    return Outcome.count(conn.execute(SKIP_UNMATCHED, {"all": all_types, "now": now, "n": limit}).rowcount)


def recent_failures_txn(conn: Connection, limit: int, scope_id: str | None = None) -> list[RowMapping]:
    """The newest given-up deliveries (all scopes for /ops, or one scope)."""
    return list(conn.execute(
        sql(
            "SELECT f.scope_id, f.subscription_id, f.event_id, f.attempts, f.error, f.failed_at, s.url"
            " FROM webhook_failures f JOIN webhook_subscriptions s ON s.id = f.subscription_id"
            " WHERE (CAST(:s AS varchar) IS NULL OR f.scope_id = CAST(:s AS varchar))"
            " ORDER BY f.failed_at DESC LIMIT :n"
        ),
        {"n": limit, "s": scope_id},
    ).mappings())

