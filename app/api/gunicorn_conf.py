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
  runs in ``on_starting``, before any socket is opened);
* an API on a database that lacks its code's migrations refuses to start, saying what to run, as a
  worker does (:func:`_check_schema`).

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
    _check_threads(server)
    _check_schema(server)


def _check_schema(server) -> None:
    """Exit 1 when the database is behind this code's migrations (the API started before
    ``memeflow db upgrade``, a replica that raced the migrate job): it would answer every request
    500, or its workers would die of an UndefinedTable traceback. A database migrated beyond the
    code (a rolling upgrade) is allowed with a warning; one not reachable yet is left to /readyz."""
    from app.db.engine import SchemaBehind, require_schema_not_behind
    from app.runtime import resolve_urls

    try:
        state = require_schema_not_behind(resolve_urls(_settings).database_url)
    except SchemaBehind as exc:
        server.log.error("refusing to start: %s", exc)
        raise SystemExit(1) from None
    except Exception as exc:  # noqa: BLE001 - not reachable yet: /readyz says so until it is
        server.log.warning("could not check the database's migrations at start: %s", exc)
        return
    if state == "ahead":
        server.log.warning("the database is migrated beyond this code's head: a newer release runs "
                           "against it; upgrade this API")


def _request_threads(cfg) -> int | None:
    """Requests one worker process serves at once: its threads (gthread), 1 (sync); None: another
    kind of worker, whose concurrency is not threads."""
    from gunicorn.workers.gthread import ThreadWorker
    from gunicorn.workers.sync import SyncWorker

    worker = cfg.worker_class
    if issubclass(worker, ThreadWorker):
        return int(cfg.threads)
    return 1 if issubclass(worker, SyncWorker) else None


def _check_threads(server) -> None:
    """A live event stream holds one request thread for up to MEMEFLOW_EVENT_STREAM_MAX_S and a
    search one for its ranking; a process admits MEMEFLOW_EVENT_STREAMS_PER_PROCESS of the first
    and MEMEFLOW_SEARCHES_PER_PROCESS of the second at once: with no more threads than both
    together, open library pages and a few tenants' searches take every thread, and /healthz and
    every other request (uploads, reads) wait. Refuse it."""
    n = _request_threads(server.cfg)
    streams, searches = _settings.event_streams_per_process, _settings.searches_per_process
    if n is not None and n <= streams + searches:
        server.log.error(
            "refusing to start: %d request thread(s) per worker process, and up to "
            "MEMEFLOW_EVENT_STREAMS_PER_PROCESS=%d live event streams and MEMEFLOW_SEARCHES_PER_PROCESS=%d "
            "searches may hold one each: use more threads (--threads, compose API_THREADS; default %d) "
            "or lower the settings", n, streams, searches, threads)
        raise SystemExit(1)
