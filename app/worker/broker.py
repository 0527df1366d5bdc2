"""Where the broker is, without ever starting anything, and the kombu transport that talks to it.

A worker, beat or Flower process must not start the embedded servers as a side effect of being
imported: it uses ``MEMEFLOW_BROKER_URL``, else the embedded Redis if it runs, else the port the
embedded Redis last used (Celery keeps retrying until it comes up).
"""

from __future__ import annotations

import json
import logging

from kombu.transport import redis as kombu_redis

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
    """The kombu transport for ``url``: :class:`RedisTransport` for a ``redis://`` broker, else
    kombu's own choice from the URL's scheme (None)."""
    return REDIS_TRANSPORT if (url or "").startswith("redis://") else None


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel with one client object for its synchronous commands.

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


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`RedisChannel`."""

    Channel = RedisChannel
