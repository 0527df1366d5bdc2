"""A webhook URL typed with non-ASCII characters in its path or query (an IRI, which the URL check
accepts) is delivered percent-encoded, as browsers send it — not an exception that escapes the lane
and leaves the subscription leased, its event never delivered nor given up, on every claim again."""

from __future__ import annotations

import pytest

from app.orchestrator import Orchestrator
from app.orchestrator.store import events as events_q
from app.worker.webhook_sender import send_event
from app.worker.webhooks import deliver_subscription
from tests.conftest import poll_until
from tests.support.receiver import Receiver

IRI_PATH = "/ok/caf\u00e9?tag=\u6897"
SENT_PATH = "/ok/caf%C3%A9?tag=%E6%A2%97"


@pytest.fixture()
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings.replace(
        webhook_allowed_networks="127.0.0.0/8", webhook_backoff_base_s=0.01, webhook_backoff_max_s=0.02,
        webhook_timeout_s=1.0, webhook_max_attempts=3,
    ))


def test_sender_percent_encodes_a_non_ascii_path_and_query(receiver):
    from app.netguard import allowed_networks

    event = {"id": 7, "type": "batch.progress", "payload": {}}
    result = send_event(receiver.url(IRI_PATH), "whsec_x", event, timeout_s=2.0, max_response_bytes=1024,
                        networks=allowed_networks("127.0.0.0/8"))
    assert result.ok, result
    assert [r.path for r in receiver.at("/ok")] == [SENT_PATH]


def test_the_lane_delivers_to_an_iri_url_and_moves_on(orch, receiver):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url(IRI_PATH))
    for i in range(2):
        with orch.engine.begin() as c:
            events_q.stage_event_txn(c, "local", "batch.progress", {"n": i})

    def step():
        for hint in orch.webhook_hints():
            deliver_subscription(orch, hint.task_id, "test-worker")  # raised UnicodeEncodeError before
        return len(receiver.at("/ok")) >= 2

    poll_until(step, timeout=30, interval=0.01, what="two deliveries")
    assert {r.path for r in receiver.at("/ok")} == {SENT_PATH}
    state = orch.list_webhooks("local")[0]
    assert state["delivered_count"] == 2 and state["failed_count"] == 0 and state["last_error"] is None
