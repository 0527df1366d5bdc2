"""Where the broker is, without ever starting anything, and the kombu transport that talks to it.

A worker, beat or Flower process must not start the embedded servers as a side effect of being
imported: it uses ``MEMEFLOW_BROKER_URL``, else the embedded Redis if it runs, else the port the
embedded Redis last used (Celery keeps retrying until it comes up).
"""

from __future__ import annotations

import json
import logging
from queue import Empty

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from app import metrics
from app.config import Settings
from app.embedded import EmbeddedServiceError
from app.runtime import embedded_services, resolve_urls

log = logging.getLogger(__name__)
FALLBACK_BROKER_URL = "redis://127.0.0.1:6379/0"


def broker_url_for(settings: Settings) -> str:
    """The broker URL for ``settings``; never starts an embedded server."""
    if settings.broker_url:
        return settings.broker_url
    try:
        return resolve_urls(settings, start=False).broker_url
    except EmbeddedServiceError:
        pass
    services = embedded_services(settings)
    try:
        state = json.loads((services.run_dir / "redis.json").read_text())
        url = f"redis://127.0.0.1:{int(state['port'])}/0"
    except (OSError, ValueError, KeyError):
        url = FALLBACK_BROKER_URL
    log.warning("broker not running yet; will keep retrying %s", url)
    return url


def database_url_for(settings: Settings) -> str:
    """The database URL for ``settings``; the embedded PostgreSQL must already run."""
    if settings.database_url:
        return settings.database_url
    return resolve_urls(settings, start=False).database_url


#: ``celeryconfig.broker_transport`` for a redis:// broker (see :class:`RedisTransport`).
REDIS_TRANSPORT = "app.worker.broker:RedisTransport"


def broker_transport_for(url: str | None) -> str | None:
    """The kombu transport for ``url``: :class:`RedisTransport` for a ``redis://`` or ``rediss://``
    broker (TLS then comes from ``broker_use_ssl``, :func:`broker_ssl_for`, which kombu's Redis
    channel reads whatever the transport's name), else kombu's own choice from the URL's scheme
    (None)."""
    return REDIS_TRANSPORT if (url or "").startswith(("redis://", "rediss://")) else None


def broker_ssl_for(url: str | None) -> dict | None:
    """Celery's ``broker_use_ssl`` for ``url``: for a ``rediss://`` broker, verify the server's
    certificate (``ssl_cert_reqs`` required), as redis-py (the ``/readyz`` probe) does; kombu's own
    default for such a URL is an unverified connection. ``ssl_*`` options in the URL's query
    (``ssl_ca_certs``, ``ssl_cert_reqs=none`` …) replace this default as a whole. None otherwise."""
    if not (url or "").startswith("rediss://"):
        return None
    import ssl

    return {"ssl_cert_reqs": ssl.CERT_REQUIRED}


#: The largest queue message a worker parses (bytes). A hint is an id in a ~1 KiB envelope, a
#: worker's control reply a few KiB; anything this large is not ours.
MAX_MESSAGE_BYTES = 1 << 20


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel with one client object for its synchronous commands, that drops a
    queue message it cannot deliver instead of dying of it.

    Anyone who can write to Redis can put anything in a queue. kombu parses what BRPOP returned in
    the worker's event loop, and an envelope that is not JSON, lacks its properties, has a body
    its encoding cannot decode, or would make the ack bookkeeping fail raised there: Celery
    stopped the worker ("Unrecoverable error"), one message per worker. The message is already
    off the list by then (nothing redelivers it), so it is logged, counted
    (``memeflow_broker_messages_dropped_total``) and dropped; a hint that is lost is re-sent by
    the sweep. A message that survives this is a well-formed one: what Celery does with its
    headers and body (an unknown task, a refused content type) it logs and acks itself.

    kombu builds a new ``redis.Redis`` over the channel's pool for every publish (hints, task
    events), every QoS update and every ack (``_create_client``); redis-py's constructor fills a
    ~170-entry response-callback table each time: ≈ 70 µs of CPU, more than the command's own
    round trip. The client holds no connection of its own — each command still takes one from the
    same pool and gives it back, and a client may be shared between threads — so one client per
    pool sends exactly the same commands. A new pool (after a fork or a reconnect) gets a new one."""

    _sync_client = None

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client, pool = self._sync_client, self.pool
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _disconnect_pools(self):
        self._sync_client = None  # its pool is going: the next command builds one on the new pool
        super()._disconnect_pools()

    def _brpop_read(self, **options):
        # kombu's _brpop_read (5.7), the payload checked by _deliverable before it is delivered
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next iteration reconnects
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload = self._deliverable(dest, item)
            if payload is not None:
                self.connection._deliver(payload, dest)
            return True
        finally:
            self._in_poll = None
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _deliverable(self, queue: str, item: bytes) -> dict | None:
        """The parsed envelope of ``item``, or None (logged, counted) when delivering it would fail:
        too large, not a JSON object, or one kombu cannot turn into an acknowledgeable message.
        A compressed body is refused too: memeflow never compresses, and decompressing is unbounded."""
        if len(item) > MAX_MESSAGE_BYTES:
            return self._drop(queue, "too_large", f"{len(item)} bytes")
        try:
            payload = loads(bytes_to_str(item))
        except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return self._drop(queue, "not_json", type(exc).__name__)
        if not isinstance(payload, dict):
            return self._drop(queue, "bad_envelope", f"a JSON {type(payload).__name__}")
        props, headers = payload.get("properties"), payload.get("headers")
        info = props.get("delivery_info") if isinstance(props, dict) else None
        if not (isinstance(props, dict) and isinstance(props.get("delivery_tag"), str) and props["delivery_tag"]
                and isinstance(info, dict) and isinstance(info.get("exchange"), str)
                and isinstance(info.get("routing_key"), str) and isinstance(headers, dict | None)
                and isinstance(payload.get("body"), str | None)):
            return self._drop(queue, "bad_envelope", "properties, delivery tag or headers missing or mistyped")
        if headers and "compression" in headers:
            return self._drop(queue, "compressed", str(headers["compression"])[:64])
        try:
            self.Message(payload, channel=self)  # exactly what the consumer builds next
        except Exception as exc:  # noqa: BLE001 - a body its encoding cannot decode, an unknown encoding
            return self._drop(queue, "bad_body", type(exc).__name__)
        return payload

    @staticmethod
    def _drop(queue: str, reason: str, detail: str) -> None:
        log.warning("undeliverable broker message dropped (%s: %s)", reason, detail,
                    extra={"lane": queue, "code": reason})
        metrics.BROKER_MESSAGES_DROPPED.labels(reason=reason).inc()
        return None


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`RedisChannel`."""

    Channel = RedisChannel
