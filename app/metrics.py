"""Prometheus metrics (``memeflow_`` prefix). Counters are process-local; the API serves its own
at ``/metrics`` and each worker process serves its own on ``MEMEFLOW_METRICS_PORT`` (one port per
process: set it per container, or leave it 0 to disable). DB-truth gauges (queue depth, oldest
queued age) are computed by the sweep and kept with its completion time in ``sweep_state``; the API's
``/metrics`` serves that snapshot plus the worker registry's per-lane counts (no count over the tasks
table per scrape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

CLAIMS = Counter("memeflow_claims_total", "Successful task claims", ["lane"])
CLAIM_LOCK_TIMEOUTS = Counter("memeflow_claim_lock_timeouts_total",
                              "Batched claims whose hinted task stayed locked past lock_timeout (hinted again)", ["lane"])
EMPTY_CLAIMS = Counter("memeflow_empty_claims_total", "Claims that found nothing (stale/duplicate hints)", ["lane"])
COMPLETIONS = Counter("memeflow_completions_total", "Task completions by outcome", ["lane", "outcome"])
FENCING_REJECTIONS = Counter(
    "memeflow_fencing_rejections_total", "Fenced writes rejected (zero rows updated)", ["operation"]
)
REHINTS = Counter("memeflow_rehints_total", "Hints re-published by the sweep", ["reason"])
SEARCH_SWITCHES = Counter("memeflow_search_switches_total",
                          "Switches of a scope's search serving model (cutover, early_cutover, rollback)",
                          ["kind", "action"])
HINTS_PUBLISHED = Counter("memeflow_hints_published_total", "Hints published to the broker", ["lane"])
HINTS_CONTINUED = Counter(
    "memeflow_hints_continued_total", "Hints a worker handled itself instead of publishing them", ["lane"]
)
BROKER_MESSAGES_DROPPED = Counter(
    "memeflow_broker_messages_dropped_total",
    "Queue messages a worker dropped without running them (app/worker/broker.py, app/worker/strategy.py)", ["reason"],
)
HINT_PUBLISH_FAILURES = Counter("memeflow_hint_publish_failures_total", "Hints the broker did not take", ["lane"])
STAGE_DURATION = Histogram(
    "memeflow_stage_duration_seconds", "Time from claim to completion per stage", ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
THUMBNAILS_GENERATED = Counter("memeflow_thumbnails_generated_total", "Thumbnails rendered (cache misses)")
SWEEP_DURATION = Histogram("memeflow_sweep_duration_seconds", "Reconcile sweep duration")
SCOPE_INDEX_BUILDS = Counter("memeflow_scope_index_builds_total", "Per-scope HNSW index builds", ["outcome"])
SWEEP_STEP_FAILURES = Counter("memeflow_sweep_step_failures_total", "Sweep steps that raised (the others still ran)",
                              ["step"])
API_SHARE_YIELDS = Counter("memeflow_api_share_yields_total",
                           "An API process's shares (live event streams) ended for a scope below its fair share",
                           ["kind"])
API_SHARE_REFUSALS = Counter("memeflow_api_share_refusals_total",
                             "Requests refused a share of an API process's streams or searches (429)", ["kind", "why"])
QUEUE_DEPTH = Gauge("memeflow_queue_depth", "Queued tasks per lane (DB truth)", ["lane"], multiprocess_mode="max")
RUNNING_TASKS = Gauge("memeflow_running_tasks", "Running tasks per lane (DB truth)", ["lane"], multiprocess_mode="max")
OLDEST_QUEUED_AGE = Gauge(
    "memeflow_oldest_queued_age_seconds", "Age of the oldest due queued task per lane", ["lane"],
    multiprocess_mode="max",
)

SWEEP_LAST_SUCCESS = Gauge(
    "memeflow_sweep_last_success_timestamp", "Unix time of the last completed reconcile sweep (0: none yet)",
    multiprocess_mode="max",
)
LANE_WORKERS = Gauge(
    "memeflow_lane_workers", "Live worker processes consuming each lane's queue (worker registry)", ["lane"],
    multiprocess_mode="max",
)


def set_lane_gauges(gauges: Mapping[str, Mapping[str, Any]]) -> None:
    """Queue depth, running tasks and oldest queued age per lane from a sweep's snapshot."""
    for lane, g in gauges.items():
        QUEUE_DEPTH.labels(lane).set(g.get("queued", 0))
        RUNNING_TASKS.labels(lane).set(g.get("running", 0))
        OLDEST_QUEUED_AGE.labels(lane).set(float(g.get("oldest_age") or 0))


def set_liveness(liveness: Any) -> None:
    """The sweep's snapshot, its completion time and the live workers per lane (an ``app.orchestrator.
    liveness.Liveness``)."""
    set_lane_gauges(liveness.lane_gauges)
    at = liveness.sweep_last_success_at
    SWEEP_LAST_SUCCESS.set(at.timestamp() if at is not None else 0)
    for name, lane in liveness.lanes.items():
        LANE_WORKERS.labels(name).set(lane.workers)


_served_port: int | None = None


def serve(port: int, host: str = "0.0.0.0", token: str | None = None) -> int:
    """Expose this process's metrics on ``host:port`` (workers; the API serves /metrics itself).
    With ``token`` (``MEMEFLOW_METRICS_TOKEN``), a scrape must send ``Authorization: Bearer
    <token>``, as the API's /metrics requires.

    Idempotent per process. Returns the port actually bound (``port=0`` picks a free one)."""
    global _served_port
    if _served_port is None:
        _served_port = start_server(port, host, token).server_address[1]
    return _served_port


def start_server(port: int, host: str, token: str | None = None) -> Any:
    """A metrics HTTP server in a daemon thread (prometheus_client's own, behind a bearer check
    when ``token`` is set); returns the server (``shutdown()`` stops it)."""
    import socket
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    app = make_wsgi_app()
    if token:
        app = _bearer_guard(app, token)
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
            pass

    server = make_server(host, port, app, Server, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def _bearer_guard(app: Any, token: str) -> Any:
    import hmac

    expected = token.encode()

    def guarded(environ: dict, start_response: Any) -> Any:
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            start_response("401 Unauthorized", [("Content-Type", "application/json"),
                                                ("WWW-Authenticate", 'Bearer realm="memeflow-metrics"')])
            return [b'{"error": "unauthorized", "message": "a valid metrics bearer token is required"}']
        return app(environ, start_response)

    return guarded
