"""gunicorn settings for the API: ``gunicorn -c python:app.api.gunicorn_conf app.api.wsgi:app``.

``memeflow api``, ``memeflow up`` and docker-compose all start gunicorn with this file, so that:

* a few slow or idle clients cannot take every worker: the threaded worker (``gthread``) parks idle
  keep-alive connections in its event loop (no thread), hands a connection that has sent nothing
  back to it after gunicorn's 5 s data timeout, and serves ``threads`` requests at once per worker;
  request line and header sizes are bounded; ``timeout`` recycles a worker whose main loop hangs
  and ``graceful_timeout`` bounds a restart. For a service on the open internet put a buffering
  reverse proxy in front anyway (docs/security.md has an nginx example): it absorbs slow uploads
  before they reach a thread.
* gunicorn's own error responses are JSON like the app's (:mod:`app.api.server`);
* an unauthenticated instance is never bound beyond loopback (:func:`app.netguard.check_bind`
  runs in ``on_starting``, before any socket is opened).

Command-line flags (``-b``, ``-w``, ``--threads`` …) override these values as usual.
"""

from __future__ import annotations

import os

from app.config import Settings

_settings = Settings.from_env()

bind = [f"{_settings.api_host}:{_settings.api_port}"]
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "app.api.server.JsonErrorWorker"  # gthread whose own errors (parse, timeout abort) are JSON
threads = 16
worker_connections = 1000  # open connections per worker (idle keep-alive ones cost no thread)
timeout = 60
graceful_timeout = 20
keepalive = 5
limit_request_line = 4094
limit_request_fields = 60
limit_request_field_size = 8190


def on_starting(server) -> None:
    """Refuse to open a non-loopback socket for an unauthenticated API (exit 1, clear message)."""
    from app.netguard import UnsafeBind, check_bind, split_bind

    for address in server.cfg.bind:
        try:
            check_bind(_settings, split_bind(address))
        except UnsafeBind as exc:
            server.log.error("%s", exc)
            raise SystemExit(1) from None
