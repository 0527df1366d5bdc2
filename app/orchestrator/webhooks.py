"""Webhook subscriptions and the delivery lane's transitions (issue 20).

Subscriptions are per scope. The lane (``app.worker.webhooks``) claims one subscription at a time
(lease + fencing token), takes its next event after the cursor, POSTs it, and records the outcome
here: delivered → cursor moves on; failed → back off with jitter (the claim is released), or after
``webhook_max_attempts`` give the event up (``webhook_failures``, shown on /ops) and move on. The
event read is scoped by the subscription's own row, so one scope's events never reach another's.

The lane is shared fairly between scopes (the rules are the store's: store/webhooks.py): a claim
is refused while a scope with fewer deliveries in flight waits, hints take scopes in turn, and a
claim hands over (``hand_over_webhook``) when its turn is up.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import OperationalError

from app import metrics
from app.db.engine import read_connection
from app.db.enums import EventType
from app.ids import parse_uuid
from app.netguard import OutboundRefused, allowed_networks, check_outbound_url
from app.orchestrator.errors import InvalidWebhook, NotFound, TooManyWebhooks, WebhookDeliveryInFlight
from app.orchestrator.events import event_doc
from app.orchestrator.execution import LOCK_NOT_AVAILABLE, stored_error
from app.orchestrator.hints import Hint
from app.orchestrator.retry import decide_delivery_retry
from app.orchestrator.store import counters
from app.orchestrator.store import events as events_q
from app.orchestrator.store import webhooks as q

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

LANE = "webhooks"
ALL_TYPES = [t.value for t in EventType]


@dataclass(frozen=True)
class WebhookClaim:
    subscription_id: uuid.UUID
    scope_id: str
    url: str
    secret: str
    event_types: list[str]
    owner: str
    generation: int
    attempts: int  # failed attempts already spent on the event after the cursor
    cursor: int  # the last event id whose outcome is final


def webhook_doc(row: Any) -> dict[str, Any]:
    """The API shape of a subscription (never its secret)."""
    def iso(v):
        return v.isoformat() if v is not None else None

    return {
        "id": str(row["id"]), "url": row["url"], "event_types": list(row["event_types"]),
        "created_at": iso(row["created_at"]), "cursor": int(row["cursor"]), "attempts": int(row["attempts"]),
        "delivered_count": int(row["delivered_count"]), "failed_count": int(row["failed_count"]),
        "last_error": row["last_error"], "last_delivery_at": iso(row["last_delivery_at"]),
        "next_attempt_at": iso(row["next_attempt_at"]),
    }


def _checked_url(orch: Orchestrator, url: str) -> str:
    """``url`` checked and resolved; the lookup gets a delivery's timeout (``webhook_timeout_s``)
    at most, so a stalling nameserver holds the API thread no longer than a delivery's would."""
    timeout_s = orch.settings.webhook_timeout_s
    try:
        check_outbound_url(url, allowed_networks(orch.settings.webhook_allowed_networks),
                           deadline=time.monotonic() + timeout_s)
    except OutboundRefused as exc:
        raise InvalidWebhook(str(exc), code=exc.code) from None
    except TimeoutError:
        raise InvalidWebhook(f"the URL's host did not resolve within {timeout_s:g}s",
                             code="webhook_url_unresolvable") from None
    return url


def _event_types(values: list[str] | None) -> list[str]:
    if not values:
        return list(ALL_TYPES)
    unknown = sorted({v for v in values if v not in ALL_TYPES})
    if unknown:
        raise InvalidWebhook(f"unknown event types: {', '.join(map(repr, unknown[:5]))}; known: {', '.join(ALL_TYPES)}",
                             code="invalid_event_type")
    return list(dict.fromkeys(values))


def create_webhook(orch: Orchestrator, scope_id: str, url: str, event_types: list[str] | None = None
                   ) -> tuple[dict[str, Any], str]:
    """Subscribe ``url`` to the scope's events from now on; returns (subscription, secret) — the
    secret is shown this once. 422 for a URL that is not http(s), too long or not allowed (SSRF)."""
    types = _event_types(event_types)
    url = _checked_url(orch, url)
    secret = "whsec_" + secrets.token_urlsafe(32)
    with orch.engine.begin() as conn:
        from app.orchestrator.store.images import ensure_scope_txn

        ensure_scope_txn(conn, scope_id)
        q.lock_scope_txn(conn, scope_id)  # the per-scope count is decided one creation at a time
        if q.count_txn(conn, scope_id) >= orch.settings.webhooks_per_scope:
            raise TooManyWebhooks(f"at most {orch.settings.webhooks_per_scope} webhooks per scope")
        cursor = events_q.last_event_id_txn(conn, scope_id)  # deliver what happens from now on
        row = q.insert_txn(conn, scope_id, url, types, secret, cursor, orch.now())
        q.notify_created_txn(conn)  # a poller sleeping while no subscription existed wakes at commit
    return webhook_doc(row), secret


def list_webhooks(orch: Orchestrator, scope_id: str) -> list[dict[str, Any]]:
    with orch.engine.connect() as conn:
        return [webhook_doc(r) for r in q.list_txn(conn, scope_id)]


def delete_webhook(orch: Orchestrator, scope_id: str, subscription_id: uuid.UUID | str) -> None:
    """Delete a subscription: no delivery to it is in flight or starts after this returns (it waits
    for a POST in flight, ≤ ``webhook_timeout_s``; a claim between deliveries is fenced).
    ``WebhookDeliveryInFlight`` (409) when a delivery still holds it after that wait: retry."""
    sub = parse_uuid(subscription_id)
    if sub is None:
        raise NotFound("webhook not found")
    try:
        with orch.engine.begin() as conn:
            if not q.delete_txn(conn, scope_id, sub, orch.settings.webhook_timeout_s).matched:
                raise NotFound("webhook not found")  # not matched: none of this scope by that id
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        raise WebhookDeliveryInFlight("a delivery to this webhook is in flight; retry in a few seconds") from None


# ---------------------------------------------------------------------------- the delivery lane
def claim_webhook(orch: Orchestrator, subscription_id: uuid.UUID, owner: str) -> WebhookClaim | None:
    """Claim a subscription that has an event due; None for a stale, duplicate or unknown hint, or
    a refused one (a scope with fewer deliveries in flight waits)."""
    now = orch.now()
    with orch.engine.begin() as conn:
        claimed = q.claim_txn(conn, subscription_id, owner, now, orch.settings.webhook_lease_s)
        if not claimed.matched:  # stale, duplicate or unknown hint, nothing due, or refused: the hint is spent
            q.clear_hint_txn(conn, subscription_id, now)
    if not claimed.matched:
        metrics.EMPTY_CLAIMS.labels(LANE).inc()
        return None
    row = claimed.row
    metrics.CLAIMS.labels(LANE).inc()
    return WebhookClaim(row["id"], row["scope_id"], row["url"], row["secret"], list(row["event_types"]), owner,
                        row["claim_generation"], row["attempts"], row["cursor"])


@contextmanager
def next_webhook_event(orch: Orchestrator, claim: WebhookClaim, after: int
                       ) -> Iterator[tuple[dict[str, Any], int] | None]:
    """The claim's next event after ``after`` — of the subscription's own scope and types only —
    and the failed attempts already spent on it, for a block that delivers it: read through the
    fence (None: nothing due, or the claim was fenced out — deleted, lease lost), and the
    subscription cannot be deleted until the block ends, so no delivery is in flight or starts
    once a DELETE returned. The block holds a connection for the delivery (≤ ``webhook_timeout_s``).

    The attempts are the row's, not the claim's: a prune since the claim may have removed the
    event they were spent on and reset them for this one."""
    with orch.engine.begin() as conn:
        row = q.next_event_txn(conn, claim.subscription_id, claim.owner, claim.generation, after)
        yield (event_doc(row), int(row["attempts"])) if row is not None else None


def webhook_delivered(orch: Orchestrator, claim: WebhookClaim, event_id: int) -> bool:
    """Fenced: move the cursor past a delivered event. False = fenced out (stop delivering)."""
    with orch.engine.begin() as conn:
        ok = q.delivered_txn(conn, claim.subscription_id, claim.owner, claim.generation, event_id, orch.now(),
                             orch.settings.webhook_lease_s).matched
        if not ok:
            _rejected_txn(orch, conn, claim)
    return ok


def webhook_failed(orch: Orchestrator, claim: WebhookClaim, event_id: int, attempts: int, error: dict[str, Any]
                   ) -> str:
    """Fenced: record the ``attempts``-th failure of an event. Returns ``"retry"`` (claim released,
    due again after backoff), ``"gave_up"`` (recorded, cursor moved: deliver the next) or
    ``"fenced"``.

    The error's code and message are stored as a stage failure's are (:func:`stored_error`): the
    message may quote the receiver's own bytes (a status line of NUL bytes), which jsonb refuses —
    the write that records the failure must never be the one that fails."""
    s = orch.settings
    now = orch.now()
    code, message = error.get("code", ""), error.get("message", "")  # a delivery's, no job's: docs/events.md
    error = {**error, **stored_error(code, message)}
    decision = decide_delivery_retry(attempts, max_attempts=s.webhook_max_attempts, now=now,
                                     base_s=s.webhook_backoff_base_s, max_s=s.webhook_backoff_max_s, rand=orch.rand)
    with orch.engine.begin() as conn:
        if decision.give_up:
            done = q.gave_up_txn(conn, claim.subscription_id, claim.owner, claim.generation, event_id, attempts,
                                 error, now, s.webhook_lease_s)
        else:
            done = q.retry_later_txn(conn, claim.subscription_id, claim.owner, claim.generation, event_id,
                                     attempts, decision.available_at, error)
        if not done.matched:
            _rejected_txn(orch, conn, claim)
            return "fenced"
    metrics.COMPLETIONS.labels(LANE, "gave_up" if decision.give_up else "retry").inc()
    return "gave_up" if decision.give_up else "retry"


def release_webhook(orch: Orchestrator, claim: WebhookClaim) -> None:
    """End a claim with nothing left to deliver (fenced)."""
    with orch.engine.begin() as conn:
        # not matched: the lease was lost (expired and re-claimed) — nothing of ours to release
        q.release_txn(conn, claim.subscription_id, claim.owner, claim.generation)


def webhook_should_hand_over(orch: Orchestrator, claim: WebhookClaim) -> bool:
    """Whether the claim should hand over before its next delivery: a scope with at least two fewer
    deliveries in flight than the claim's waits (store/webhooks.py FAIRER_SCOPE_WAITING)."""
    with read_connection(orch.engine) as conn:
        return q.fairer_scope_waiting_txn(conn, claim.scope_id, orch.now())


def hand_over_webhook(orch: Orchestrator, claim: WebhookClaim) -> list[Hint]:
    """End a claim whose turn is up while events are still due: release the subscription (due
    again behind its scope's longer-waiting ones; fenced) and, in the same transaction, hint the
    fairest unhinted waiting subscription — another scope's, a sibling, or this one again."""
    now = orch.now()
    with orch.engine.begin() as conn:
        # not matched: the lease was lost (expired and re-claimed) — the new claim delivers; the
        # thread still goes to whoever is fairest
        q.hand_over_txn(conn, claim.subscription_id, claim.owner, claim.generation, now)
        due = q.due_for_hint_txn(conn, now, orch.settings.rehint_grace_s, 1)
    return [Hint(LANE, i) for i in due.rows] if due.matched else []  # not matched: nobody unhinted waits


def webhook_hints(orch: Orchestrator, limit: int | None = None) -> list[Hint]:
    """Wake-ups for subscriptions with an event due and nobody on it (the webhooks workers' poll and
    the sweep both call this; a hint older than ``rehint_grace_s`` is taken as lost)."""
    with orch.engine.begin() as conn:
        due = q.due_for_hint_txn(conn, orch.now(), orch.settings.rehint_grace_s,
                                 limit or orch.settings.sweep_batch_limit)
    return [Hint(LANE, i) for i in due.rows] if due.matched else []  # not matched: nothing to wake


def any_webhook(orch: Orchestrator) -> bool:
    """Whether any subscription exists (of any scope): the hint pollers sleep while none does."""
    with read_connection(orch.engine) as conn:
        return q.any_subscription_txn(conn)


def skip_unmatched_events(orch: Orchestrator) -> int:
    """Sweep step: filtered subscriptions' cursors skip the events they do not take."""
    with orch.engine.begin() as conn:
        skipped = q.skip_unmatched_txn(conn, len(ALL_TYPES), orch.now(), orch.settings.sweep_batch_limit)
    return skipped.affected if skipped.matched else 0  # not matched: no idle filtered subscription


def recent_webhook_failures(orch: Orchestrator, limit: int = 20) -> list[dict[str, Any]]:
    with orch.engine.connect() as conn:
        return [dict(r) for r in q.recent_failures_txn(conn, limit)]


def _rejected_txn(orch: Orchestrator, conn: Any, claim: WebhookClaim) -> None:
    metrics.FENCING_REJECTIONS.labels("webhook").inc()
    counters.bump_txn(conn, "fencing_rejection", claim.scope_id, orch.now())
