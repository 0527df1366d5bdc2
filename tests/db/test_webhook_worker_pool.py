"""A `memeflow worker --lane webhooks` process (a threads pool of WEBHOOK_THREADS) has a database
connection for every delivery thread at once — each holds one across its POST (the subscription
row share-locked) — and one more for the hint poller, so no receiver waits for another's answer
to be contacted and the poll never waits for a slow receiver."""

from __future__ import annotations

import threading
import types
import uuid

import pytest

from app.cli.processes import lane_pool
from app.config import reset_settings
from app.worker import tasks
from app.worker.runtime import get_runtime, reset_runtime
from app.worker.webhook_sender import SendResult
from app.worker.webhooks import deliver_subscription
from tests.db.test_webhooks import emit


@pytest.fixture()
def webhooks_worker(settings, monkeypatch):
    """The runtime a webhooks worker's tasks and poller share, built the way Celery starts it:
    worker_init (``_preload_in_solo``, a threads pool) first, then worker_ready's poller calls
    ``get_runtime()``."""
    s = settings.replace(webhook_allowed_networks="127.0.0.0/8")
    monkeypatch.setenv(tasks.PRELOAD_ENV, "webhooks")  # what `memeflow worker --lane webhooks` sets
    reset_settings(s)
    reset_runtime()
    pool, threads = lane_pool(s, ["webhooks"])
    assert pool == "threads"
    thread_pool = type("TaskPool", (), {"__module__": "celery.concurrency.thread"})
    tasks._preload_in_solo(sender=types.SimpleNamespace(pool_cls=thread_pool, concurrency=threads))
    try:
        yield get_runtime(), threads
    finally:
        reset_runtime()
        reset_settings()


def test_every_delivery_thread_reaches_its_receiver_at_once_and_the_poll_still_runs(webhooks_worker):
    rt, threads = webhooks_worker
    orch = rt.orch
    subs = []
    for i in range(threads):  # one scope each: the lane's fairness admits every claim
        orch.ensure_scope(f"s{i}")
        hook, _ = orch.create_webhook(f"s{i}", f"http://127.0.0.1:9/{i}")
        emit(orch, f"s{i}", 1)
        subs.append(uuid.UUID(hook["id"]))
    all_in, answer = threading.Barrier(threads + 1, timeout=20), threading.Event()

    def slow_receiver(url, secret, event, **kw) -> SendResult:
        all_in.wait()  # every thread is in its POST, holding its connection
        answer.wait(20)
        return SendResult(True, 200)

    workers = [threading.Thread(target=deliver_subscription, args=(orch, sub, f"w{i}"),
                                kwargs={"send": slow_receiver}) for i, sub in enumerate(subs)]
    for t in workers:
        t.start()
    try:
        all_in.wait()  # BrokenBarrierError: some thread could not get a connection to start its POST
        assert orch.webhook_hints() == []  # the poller's step gets a connection meanwhile (all leased)
    finally:
        answer.set()
        for t in workers:
            t.join()
    assert [w["delivered_count"] for i in range(threads) for w in orch.list_webhooks(f"s{i}")] == [1] * threads
