"""Per-request trusted context and the application's service handles."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flask import current_app, g, request
from flask_smorest import Blueprint

from app.scopes import validate_scope_id

log = logging.getLogger("memeflow.api")


@dataclass(frozen=True)
class RequestContext:
    """Immutable per-request facts from trusted sources only (never body/query/path)."""

    scope_id: str


@dataclass
class Services:
    """What the views need, built once by the app factory."""

    settings: Any
    orchestrator: Any
    engine: Any
    publisher: Any
    store: Any
    cursors: Any
    scope_resolver: Any


def services() -> Services:
    return current_app.extensions["memeflow"]


def scope_id() -> str:
    """The scope of the current request, resolved by the trusted resolver."""
    return g.memeflow_context.scope_id


def protect(blp: Blueprint) -> Blueprint:
    """Resolve the scope once before every request of ``blp`` (401 when the resolver refuses)."""

    @blp.before_request
    def _resolve_scope() -> None:
        resolved = services().scope_resolver.resolve(request.headers)
        g.memeflow_context = RequestContext(scope_id=validate_scope_id(resolved))

    return blp


def limit_rate(kind: str) -> None:
    """Count this request against the scope's ``kind`` per-minute limit ("uploads" or
    "processing"); 429 ``rate_limited`` with ``Retry-After`` when over. The window is per API token
    in token mode (the bearer the resolver just accepted, by its sha256) and per scope otherwise
    (also for ``memeflow ingest``'s in-process app, which has no bearer)."""
    svc = services()
    scope = scope_id()
    key = f"scope:{scope}"
    _, _, token = request.headers.get("Authorization", "").partition(" ")
    if svc.settings.auth == "token" and token.strip():  # (no bearer: the operator's in-process app)
        from app.auth import hash_token

        key = f"token:{hash_token(token.strip())}"
    svc.orchestrator.take_request(kind, scope, key)


def publish(hints: Iterable[Any]) -> None:
    """Publish hints after the orchestrator's commit; a failure is logged, never surfaced."""
    hints = list(hints or [])
    if not hints:
        return
    try:
        services().publisher.publish(hints)
    except Exception:  # the sweep re-hints; the request already succeeded
        log.exception("hint publish failed; the sweep will re-hint")
