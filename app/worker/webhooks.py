"""The webhook delivery lane's worker side: the loop a hint runs, and the poller that wakes it.

``deliver_subscription`` is what a ``memeflow.deliver_webhooks`` message (body: a subscription
id) runs: claim the subscription (lease + fencing token), then deliver its events one by one, in
id order, each outcome written fenced before the next is sent, at most
``webhook_events_per_claim`` per claim (then it hints itself again so other subscriptions get a
turn). A stale, duplicate or unknown id claims nothing.

Who hints: every webhooks worker runs :class:`HintPoller`, a thread that every
``MEMEFLOW_WEBHOOK_POLL_S`` marks and hints subscriptions with an event due and nobody on it
(``Orchestrator.webhook_hints``); the reconcile sweep runs the same step, so a deployment without
the poller (or a lost hint, an expired lease, a finished backoff) still delivers.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from app.netguard import allowed_networks
from app.orchestrator.hints import Hint, HintPublisher
from app.orchestrator.service import Orchestrator
from app.orchestrator.webhooks import LANE
from app.worker.webhook_sender import SendResult, send_event

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
    attempts, cursor = claim.attempts, claim.cursor
    for _ in range(s.webhook_events_per_claim):
        event = orch.next_webhook_event(claim, cursor)
        if event is None:
            orch.release_webhook(claim)
            return []
        result = send(claim.url, claim.secret, event, timeout_s=s.webhook_timeout_s,
                      max_response_bytes=s.webhook_max_response_bytes, networks=networks)
        if result.ok:
            if not orch.webhook_delivered(claim, event["id"]):
                return []  # fenced out (deleted, or the lease was lost and re-claimed)
            cursor, attempts = event["id"], 0
            continue
        attempts += 1
        log.info("webhook delivery failed", extra={"scope_id": claim.scope_id, "code": result.code,
                                                   "task_id": claim.subscription_id})
        outcome = orch.webhook_failed(claim, event["id"], attempts, result.error())
        if outcome != "gave_up":
            return []  # retried after backoff (the poller or sweep hints it), or fenced
        cursor, attempts = event["id"], 0
    orch.release_webhook(claim)
    return [Hint(LANE, claim.subscription_id)]  # more may be due: come back after the others


class HintPoller:
    """A daemon thread hinting due subscriptions every ``webhook_poll_s`` (one per webhooks worker
    process; several pollers skip each other's rows with SKIP LOCKED)."""

    def __init__(self, orch: Orchestrator, publisher: HintPublisher) -> None:
        self.orch, self.publisher = orch, publisher
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-hints", daemon=True)

    def start(self) -> HintPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.orch.settings.webhook_poll_s):
            try:
                self.publisher.publish(self.orch.webhook_hints())
            except Exception:  # a DB hiccup: try again next tick (the sweep covers a long outage)
                log.exception("webhook hint poll failed")
