"""The workers' kombu transport (app/worker/broker.py) against the real Redis: one client object
per channel pool for the synchronous commands, the same messages on the wire."""

from __future__ import annotations

import uuid

import redis as redis_lib

from app.orchestrator.hints import Hint
from app.publisher import CeleryHintPublisher, celery_app_for
from app.worker.broker import RedisChannel, broker_transport_for


def test_the_redis_broker_uses_the_memeflow_transport():
    import celeryconfig

    assert broker_transport_for("redis://127.0.0.1:6379/0") == "app.worker.broker:RedisTransport"
    # TLS too (its TLS from broker_use_ssl: tests/integration/test_broker_tls.py)
    assert broker_transport_for("rediss://h:1/0") == "app.worker.broker:RedisTransport"
    assert broker_transport_for("sentinel://h:1") is None and broker_transport_for(None) is None
    assert celeryconfig.broker_transport == broker_transport_for(celeryconfig.broker_url)


def test_one_redis_client_per_pool_for_publishes(broker_url, monkeypatch):
    app = celery_app_for(broker_url, "memeflow-test")
    publisher = CeleryHintPublisher(app)
    publisher.publish([Hint("agent", uuid.uuid4())])  # the producer's channel and pool exist now
    built = []
    init = redis_lib.Redis.__init__

    def counting(self, *a, **k):
        built.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(redis_lib.Redis, "__init__", counting)
    ids = [uuid.uuid4() for _ in range(5)]
    publisher.publish([Hint("agent", t) for t in ids])
    assert built == []  # kombu's own channel built a client per publish
    monkeypatch.setattr(redis_lib.Redis, "__init__", init)
    # the hints are on the lane's queue, as Celery sent them
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        assert isinstance(channel, RedisChannel)
        got = []
        while (message := channel.basic_get("agent")) is not None:
            got.append(message.decode()[0][0])
            message.ack()
    assert got[-5:] == [str(t) for t in ids]


def test_a_new_pool_gets_a_new_client(broker_url):
    app = celery_app_for(broker_url, "memeflow-test")
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first and first.connection_pool is channel.pool
        assert channel._create_client(asynchronous=True) is not first  # the event loop's own, as kombu's
        channel._disconnect_pools()  # what a fork or a reconnect does
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()
