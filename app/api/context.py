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


def resolve_request_scope() -> str:
    """The scope of this request: the trusted resolver's answer (bearer token, or ``local``); when
    it refuses, a browser session of this site's own page script (:mod:`app.web.page_auth`), else
    the resolver's 401 stands. A page write without its CSRF header is 403 ``csrf_rejected``."""
    from app.auth import Unauthorized
    from app.web.csrf import CsrfRejected
    from app.web.page_auth import page_session

    svc = services()
    try:
        return svc.scope_resolver.resolve(request.headers)
    except Unauthorized:
        try:
            session = page_session(svc.engine)
        except CsrfRejected as exc:
            from app.api.errors import ApiError

            raise ApiError(403, CsrfRejected.code, str(exc)) from None
        if session is None:
            raise
        return session.scope_id


def protect(blp: Blueprint) -> Blueprint:
    """Resolve the scope once before every request of ``blp`` (401 when nothing authenticates)."""

    @blp.before_request
    def _resolve_scope() -> None:
        g.memeflow_context = RequestContext(scope_id=validate_scope_id(resolve_request_scope()))

    return blp


def limit_rate(kind: str) -> None:
    """Count this request against the scope's ``kind`` per-minute limit ("uploads" or
    "processing"); 429 ``rate_limited`` with ``Retry-After`` when over. The window is per API token
    in token mode (the bearer the resolver just accepted, by its sha256) and per scope otherwise
    (also for ``memeflow ingest``'s in-process app, which has no bearer); a signed-in library page
    counts against the window of the token that opened its session."""
    svc = services()
    scope = scope_id()
    svc.orchestrator.take_request(kind, scope, rate_key(svc.settings, scope, g.get("api_page_session")))


def rate_key(settings: Any, scope: str, session: Any) -> str:
    """The rate-limit window this request counts in (see :func:`limit_rate`); ``session`` is the
    browser session that authenticated it, if one did (the library page's, or /ops')."""
    _, _, token = request.headers.get("Authorization", "").partition(" ")
    if settings.auth == "token" and token.strip():  # (no bearer: the operator's in-process app)
        from app.auth import hash_token

        return f"token:{hash_token(token.strip())}"
    if session is not None and session.token_sha256:  # a signed-in page: its token's window
        return f"token:{session.token_sha256}"
    return f"scope:{scope}"


def publish(hints: Iterable[Any]) -> None:
    """Publish hints after the orchestrator's commit; a failure is logged, never surfaced."""
    hints = list(hints or [])
    if not hints:
        return
    try:
        services().publisher.publish(hints)
    except Exception:  # the sweep re-hints; the request already succeeded
        log.exception("hint publish failed; the sweep will re-hint")
