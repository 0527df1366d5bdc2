"""Root operational endpoints: ``/healthz``, ``/readyz``, ``/metrics``.

``/readyz`` and ``/metrics`` are cheap enough to be polled by any number of probes and scrapers:
they reuse the API's database pool and one Redis connection pool per process, read the code's
migration head once, and never count the tasks table (the sweep's snapshot and the worker
registry are a few small reads). ``/readyz`` shows no version strings (database, broker or
migration revisions): ``memeflow db current`` shows them to an operator.
"""

from __future__ import annotations

import functools
import hmac
import logging
import threading
from typing import Any

from flask import Response, request
from flask.views import MethodView
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app import metrics
from app.api import schemas as S
from app.api.context import Blueprint, services
from app.api.errors import ApiError
from app.orchestrator.liveness import Liveness, read_liveness_txn

log = logging.getLogger("memeflow.api")
blp = Blueprint("health", __name__, url_prefix="", description="Liveness, readiness and metrics")


@blp.route("/healthz")
class Healthz(MethodView):
    @blp.response(200, S.HealthSchema)
    def get(self):
        """Liveness: 200 while the process serves requests."""
        return {"status": "ok"}


@functools.lru_cache(maxsize=1)
def _code_revisions() -> tuple[str, frozenset[str]]:
    """(the migration head, every revision) of the running code, read from the migration scripts
    once per process."""
    from alembic.script import ScriptDirectory

    from app.db.engine import alembic_config

    script = ScriptDirectory.from_config(alembic_config("postgresql://"))
    return script.get_current_head() or "", frozenset(rev.revision for rev in script.walk_revisions())


def _code_head() -> str:
    return _code_revisions()[0]


#: The reason /readyz gives while a newer release's migrations run under this (older) code.
MIGRATIONS_AHEAD = {"code": "migrations_ahead", "message": (
    "the database is migrated beyond this process's code (a newer release migrated it, as in a "
    "rolling upgrade): it keeps serving; upgrade it")}


def _check_database() -> tuple[dict[str, Any], dict[str, Any], Liveness | None]:
    """(database check, migrations check, liveness) over one pooled connection.

    Migrations at the code's head, or *ahead* of it (a revision the code does not know: a newer
    release's ``db upgrade`` ran first, as in a rolling upgrade — the workers and the API's start
    check allow it too) are ok; behind the code (never migrated, or an older revision of the
    code's own history) is not: nothing can serve on it."""
    from alembic.runtime.migration import MigrationContext

    try:
        head, known = _code_revisions()  # the scripts unreadable: reported as a failed check too
        with services().engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            ahead = current is not None and current not in known
            ok = current == head or ahead
            liveness = read_liveness_txn(conn, services().settings) if ok else None
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, never raised
        log.warning("readyz: database check failed: %s", exc)
        return {"ok": False, "error": type(exc).__name__}, {"ok": False, "error": "database unreachable"}, None
    if not ok:
        return {"ok": True}, {"ok": False, "error": "the database is not at the code's migration head"}, None
    return {"ok": True}, ({"ok": True, "ahead": True} if ahead else {"ok": True}), liveness


_redis_clients: dict[str, Any] = {}
_redis_lock = threading.Lock()


def _redis_client(url: str) -> Any:
    """One client (and connection pool) per broker URL and process, reused by every probe."""
    with _redis_lock:
        client = _redis_clients.get(url)
        if client is None:
            import redis

            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5, max_connections=4)
            _redis_clients[url] = client
        return client


def _check_broker() -> dict[str, Any]:
    url = services().settings.broker_url
    if not url:
        return {"ok": False, "error": "no broker configured"}
    try:
        _redis_client(url).ping()
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, never raised
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True}


@blp.route("/readyz")
class Readyz(MethodView):
    @blp.response(200, S.ReadySchema)
    @blp.alt_response(503, schema=S.ReadySchema, description="a dependency is not ready")
    def get(self):
        """Readiness: database reachable, migrations at head, broker reachable (else 503).

        ``degraded`` (still 200: the API itself serves) when the last reconcile sweep is older than
        3x its interval, a lane has queued work and no live worker, or the live agent workers were
        given different agent lane limits; ``reasons`` says which."""
        database, migrations, liveness = _check_database()
        checks: dict[str, Any] = {"database": database, "migrations": migrations, "broker": _check_broker()}
        reasons: list[dict[str, str]] = []
        if liveness is not None:
            metrics.set_liveness(liveness)
            live = liveness.as_dict()
            checks["sweep"] = {"ok": not liveness.sweep_stale, **live["sweep"]}
            checks["workers"] = {"ok": not any(lane.unserved for lane in liveness.lanes.values()),
                                 "lanes": live["lanes"], "agent_limits": live["agent_limits"]}
            reasons = liveness.reasons
        if migrations.get("ahead"):
            reasons = [MIGRATIONS_AHEAD, *reasons]
        if not all(checks[name]["ok"] for name in ("database", "migrations", "broker")):
            return {"status": "not_ready", "checks": checks, "reasons": reasons}, 503
        return {"status": "degraded" if reasons else "ready", "checks": checks, "reasons": reasons}, 200


def refresh_liveness_gauges() -> None:
    """Set the sweep's gauge snapshot, its time and the live workers per lane (skipped if the DB is down)."""
    try:
        with services().engine.connect() as conn:
            liveness = read_liveness_txn(conn, services().settings)
    except Exception as exc:  # noqa: BLE001 - a failed scrape read is logged, never raised
        log.warning("metrics: liveness gauges not refreshed: %s", exc)
        return
    metrics.set_liveness(liveness)


def _require_metrics_token() -> None:
    """With ``MEMEFLOW_METRICS_TOKEN`` set, only ``Authorization: Bearer <that token>`` may scrape.

    Unset, the metrics are open to whoever may use the API unauthenticated: anyone with
    ``MEMEFLOW_AUTH=none`` (whose own guards keep it to this machine unless opted out). In token
    mode the API is meant to be exposed, and the metrics are every tenant's activity (queue depths,
    claims, completions), which no tenant's token may read; there, without a metrics token, only a
    direct loopback peer may scrape (a request relayed by a proxy, which says so in
    ``X-Forwarded-For``/``Forwarded``, is not one)."""
    settings = services().settings
    expected = settings.metrics_token
    if not expected:
        if settings.auth == "token" and not _direct_loopback_peer():
            raise ApiError(401, "unauthorized", "set MEMEFLOW_METRICS_TOKEN to scrape /metrics from another "
                                                "machine (with MEMEFLOW_AUTH=token only this machine may without it)")
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise ApiError(401, "unauthorized", "a valid metrics bearer token is required")


def _direct_loopback_peer() -> bool:
    from app.api.hosts import loopback_peer

    relayed = "X-Forwarded-For" in request.headers or "Forwarded" in request.headers
    return not relayed and loopback_peer(request.remote_addr)


@blp.route("/metrics")
class Metrics(MethodView):
    @blp.doc(responses={
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
        "401": {"description": "MEMEFLOW_METRICS_TOKEN is set and the bearer token is missing or wrong, "
                               "or it is unset in token mode and the scrape is not from this machine"},
    })
    def get(self):
        """Prometheus metrics of this process plus the DB-truth gauges of the last sweep."""
        _require_metrics_token()
        refresh_liveness_gauges()
        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)
