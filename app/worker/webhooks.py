"""The webhook delivery lane's worker side: the loop a hint runs, and the poller that wakes it.

``deliver_subscription`` is what a ``memeflow.deliver_webhooks`` message (body: a subscription
id) runs: claim the subscription (lease + fencing token), then deliver its events one by one, in
id order, each outcome written fenced before the next is sent, until its turn is up — after
``webhook_events_per_claim`` events or ``webhook_claim_budget_s``, or as soon as a scope with at
least two fewer deliveries in flight waits (looked up at most every ``webhook_fair_check_s``) —
then it hands over: releases the subscription and hints the fairest waiting one, so one scope
cannot keep the lane's threads (docs/events.md "Sharing the lane"). A stale, duplicate, unknown
or refused id claims nothing.

Who hints: every webhooks worker runs :class:`HintPoller`, a thread that every
``MEMEFLOW_WEBHOOK_POLL_S`` marks and hints subscriptions with an event due and nobody on it
(``Orchestrator.webhook_hints``); the reconcile sweep runs the same step, so a deployment without
the poller (or a lost hint, an expired lease, a finished backoff) still delivers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from app.netguard import allowed_networks
from app.orchestrator.hints import Hint, HintPublisher
from app.orchestrator.service import Orchestrator
from app.orchestrator.store import webhooks as webhooks_q
from app.orchestrator.webhooks import WebhookClaim
from app.worker.webhook_sender import SendResult, resolve_receiver, send_event

log = logging.getLogger(__name__)

Sender = Callable[..., SendResult]


def deliver_subscription(orch: Orchestrator, subscription_id: uuid.UUID, owner: str,
                         send: Sender = send_event) -> list[Hint]:
    """Deliver the due events of one subscription under one claim; returns hints to publish."""
    claim = orch.claim_webhook(subscription_id, owner)
    if claim is None:
        return []
    s = orch.settings
    networks = allowed_networks(s.webhook_allowed_networks)
    cursor = claim.cursor
    turn = _Turn(orch, claim)
    for n in range(s.webhook_events_per_claim):
        if n and turn.is_up():
            return orch.hand_over_webhook(claim)
        # resolved before the row lock: a DELETE waits only for what the exchange's deadline bounds;
        # bounded by the timeout too, so the lease outlasts resolving plus the exchange
        target = resolve_receiver(claim.url, networks, timeout_s=s.webhook_timeout_s)
        with orch.next_webhook_event(claim, cursor) as due:  # a DELETE waits for this block
            # attempts: the failures already spent on this event (the row's: a prune may have reset them)
            event, attempts = due if due is not None else (None, 0)
            result = None if event is None else target if isinstance(target, SendResult) else send(
                claim.url, claim.secret, event, timeout_s=s.webhook_timeout_s,
                max_response_bytes=s.webhook_max_response_bytes, networks=networks, target=target)
        if event is None or result is None:  # nothing due, or fenced out (deleted, lease lost)
            orch.release_webhook(claim)
            return []
        if result.ok:
            if not orch.webhook_delivered(claim, event["id"]):
                return []  # fenced out (deleted, or the lease was lost and re-claimed)
            cursor = event["id"]
            continue
        attempts += 1
        log.info("webhook delivery failed", extra={"scope_id": claim.scope_id, "code": result.code,
                                                   "task_id": claim.subscription_id})
        outcome = orch.webhook_failed(claim, event["id"], attempts, result.error())
        if outcome != "gave_up":
            return []  # retried after backoff (the poller or sweep hints it), or fenced
        cursor = event["id"]
    return orch.hand_over_webhook(claim)  # more may be due: come back after the others


class _Turn:
    """Whether a claim's turn is up, asked between two deliveries: its ``webhook_claim_budget_s``
    is spent, or (looked up at most every ``webhook_fair_check_s``) a less-served scope waits."""

    def __init__(self, orch: Orchestrator, claim: WebhookClaim) -> None:
        self.orch, self.claim = orch, claim
        started = orch.now()
        self.budget_ends = started + timedelta(seconds=orch.settings.webhook_claim_budget_s)
        self.next_check = started

    def is_up(self) -> bool:
        now = self.orch.now()
        if now >= self.budget_ends:
            return True
        if now < self.next_check:
            return False
        self.next_check = now + timedelta(seconds=self.orch.settings.webhook_fair_check_s)
        return self.orch.webhook_should_hand_over(self.claim)


class HintPoller:
    """A daemon thread hinting due subscriptions every ``webhook_poll_s`` (one per webhooks worker
    process; several pollers skip each other's rows with SKIP LOCKED).

    While no subscription exists at all (the usual case of a library without webhooks) it does
    not poll: it LISTENs on the channel a new subscription is announced on at commit
    (``store.webhooks.CHANNEL``) and wakes on that announcement, or every ``idle_check_s`` to look
    again (a lost announcement, a listener that cannot connect). Active, it looks every
    ``idle_check_s`` whether subscriptions are still there. Without a listener connection it
    polls as before. (docs/performance-log.md §24: the idle poll was ~1 ms of CPU per image.)"""

    #: How often an idle poller looks for a subscription without an announcement, and how often an
    #: active one checks that any is left.
    IDLE_CHECK_S = 5.0

    def __init__(self, orch: Orchestrator, publisher: HintPublisher, idle_check_s: float | None = None) -> None:
        self.orch, self.publisher = orch, publisher
        self.idle_check_s = self.IDLE_CHECK_S if idle_check_s is None else idle_check_s
        self.idle = threading.Event()  # set while sleeping for lack of any subscription (tests read it)
        self._stop = threading.Event()
        self._listener = None  # a psycopg connection in autocommit, LISTENing on the channel
        self._thread = threading.Thread(target=self._run, name="webhook-hints", daemon=True)

    def start(self) -> HintPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        checked_at = float("-inf")
        active = True  # until the first check says there is nothing to deliver to
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - checked_at >= self.idle_check_s:
                    # LISTEN before looking: a subscription committed after the look is announced
                    active = not self._listen() or self._any()
                    checked_at = now
                if not active:
                    self.idle.set()
                    if self._wait_announcement(self.idle_check_s):
                        checked_at = float("-inf")  # announced: look again at once
                    continue
                self.idle.clear()
                try:
                    self.publisher.publish(self.orch.webhook_hints())
                except Exception:  # a DB hiccup: try again next tick (the sweep covers a long outage)
                    log.exception("webhook hint poll failed")
                self._stop.wait(self.orch.settings.webhook_poll_s)
        finally:
            self._close()

    def _any(self) -> bool:
        try:
            return self.orch.any_webhook()
        except Exception:  # noqa: BLE001 - cannot tell: poll (the poll logs the database's trouble)
            return True

    def _listen(self) -> bool:
        """A LISTENing connection (made once, again after it broke); False: none (poll then)."""
        if self._listener is not None and not self._listener.closed:
            return True
        self._close()
        try:
            engine = self.orch.engine
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            cparams.setdefault("connect_timeout", 5)  # never hang the poller on an unreachable server
            conn = engine.dialect.loaded_dbapi.connect(*cargs, **cparams)
            conn.autocommit = True
            conn.execute(f"LISTEN {webhooks_q.CHANNEL}")
        except Exception as exc:  # noqa: BLE001 - e.g. a pooler that forbids LISTEN: poll as before
            log.warning("webhook poller cannot LISTEN (%s); polling every %ss", type(exc).__name__,
                        self.orch.settings.webhook_poll_s)
            return False
        self._listener = conn
        return True

    def _wait_announcement(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for an announcement (True) or stop; False on timeout or error."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                # in slices, so stop() is seen within a second; no round trip while waiting
                for _ in self._listener.notifies(timeout=min(left, 1.0), stop_after=1):
                    return True
            except Exception:  # noqa: BLE001 - the connection broke: reconnect at the next look
                log.warning("webhook poller's LISTEN connection broke", exc_info=True)
                self._close()
                return True
        return False

    def _close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
        self._listener = None
