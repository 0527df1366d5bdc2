"""Root operational endpoints: ``/healthz``, ``/readyz``, ``/metrics``."""

from __future__ import annotations

import logging
from typing import Any

from flask import Response
from flask.views import MethodView
from flask_smorest import Blueprint
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api import schemas as S
from app.api.context import services
from app.api.queries import queue_gauges
from app.db.engine import migration_status
from app.db.enums import Lane
from app.metrics import OLDEST_QUEUED_AGE, QUEUE_DEPTH, RUNNING_TASKS

log = logging.getLogger("memeflow.api")
blp = Blueprint("health", __name__, url_prefix="", description="Liveness, readiness and metrics")


@blp.route("/healthz")
class Healthz(MethodView):
    @blp.response(200, S.HealthSchema)
    def get(self):
        """Liveness: 200 while the process serves requests."""
        return {"status": "ok"}


def _check_database() -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        with services().engine.connect() as conn:
            current, head = migration_status(conn)
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, never raised
        log.warning("readyz: database check failed: %s", exc)
        err = {"ok": False, "error": type(exc).__name__}
        return err, {"ok": False, "error": "database unreachable"}
    return {"ok": True}, {"ok": current == head, "current": current, "head": head}


def _check_broker() -> dict[str, Any]:
    url = services().settings.broker_url
    if not url:
        return {"ok": False, "error": "no broker configured"}
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, never raised
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True}


@blp.route("/readyz")
class Readyz(MethodView):
    @blp.response(200, S.ReadySchema)
    @blp.alt_response(503, schema=S.ReadySchema, description="a dependency is not ready")
    def get(self):
        """Readiness: database reachable, migrations at head, broker reachable."""
        database, migrations = _check_database()
        checks = {"database": database, "migrations": migrations, "broker": _check_broker()}
        ok = all(c["ok"] for c in checks.values())
        return {"status": "ready" if ok else "not_ready", "checks": checks}, (200 if ok else 503)


def refresh_queue_gauges() -> None:
    """Set the DB-truth queue gauges from one grouped query (skipped if the DB is down)."""
    try:
        rows = {r.lane: r for r in queue_gauges(services().engine)}
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, never raised
        log.warning("metrics: queue gauges not refreshed: %s", exc)
        return
    for lane in Lane:
        r = rows.get(lane.value)
        QUEUE_DEPTH.labels(lane.value).set(r.queued if r else 0)
        RUNNING_TASKS.labels(lane.value).set(r.running if r else 0)
        OLDEST_QUEUED_AGE.labels(lane.value).set(float(r.oldest_age) if r else 0.0)


@blp.route("/metrics")
class Metrics(MethodView):
    @blp.doc(responses={"200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def get(self):
        """Prometheus metrics of this process plus DB-truth queue gauges."""
        refresh_queue_gauges()
        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)
