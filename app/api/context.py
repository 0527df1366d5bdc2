"""Per-request trusted context and the application's service handles."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import flask_smorest
from flask import current_app, g, request
from webargs.flaskparser import FlaskParser, is_json_request

from app.api.shares import FairShares
from app.scopes import validate_scope_id

log = logging.getLogger("memeflow.api")


@dataclass(frozen=True)
class Credential:
    """What authenticated a request — a bearer token or a browser session, by digest — so that a
    response that outlives the request's check (an event stream) can ask again."""

    kind: str  # "token" | "session"
    digest: str  # the token's sha256, or the session cookie's

    def still_valid(self, engine: Any) -> bool:
        """Not revoked, expired or signed out (one indexed read)."""
        if self.kind == "token":
            from app.auth import token_usable

            return token_usable(engine, self.digest)
        from app.web.sessions import session_live

        return session_live(engine, self.digest)


@dataclass(frozen=True)
class RequestContext:
    """Immutable per-request facts from trusted sources only (never body/query/path)."""

    scope_id: str
    credential: Credential | None = None  # None: nothing to revoke (MEMEFLOW_AUTH=none, the local app)


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
    # this process's live event streams and searches, fairly shared among scopes (app/api/shares.py)
    streams: FairShares = field(default_factory=lambda: FairShares("streams"))
    searches: FairShares = field(default_factory=lambda: FairShares("searches"))


class JsonBodyParser(FlaskParser):
    """webargs' parser, except that a request body sent to a JSON endpoint as another media type
    (text/plain, a form, none named) is 415 ``unsupported_media_type``: webargs reads such a body
    as no body at all, so its options were silently dropped (``force_stages`` sent as text/plain
    answered "already valid"). An empty body still means "no options"."""

    def _raw_load_json(self, req: Any) -> Any:
        if not is_json_request(req) and req.get_data(cache=True):
            from app.api.errors import ApiError

            raise ApiError(415, "unsupported_media_type", "send the request body as application/json")
        return super()._raw_load_json(req)


class Blueprint(flask_smorest.Blueprint):
    """The API's blueprints: flask-smorest's, with :class:`JsonBodyParser` for ``@arguments``."""

    ARGUMENTS_PARSER = JsonBodyParser()


def services() -> Services:
    return current_app.extensions["memeflow"]


def scope_id() -> str:
    """The scope of the current request, resolved by the trusted resolver."""
    return g.memeflow_context.scope_id


def credential() -> Credential | None:
    """The credential that authenticated the current request (None: nothing that can be revoked)."""
    return g.memeflow_context.credential


def resolve_request_scope() -> str:
    """The scope of this request (see :func:`resolve_request`)."""
    return resolve_request().scope_id


def resolve_request() -> RequestContext:
    """This request's scope and credential: the trusted resolver's answer (bearer token, or
    ``local``); when it refuses, a browser session of this site's own page script
    (:mod:`app.web.page_auth`), else the resolver's 401 stands. A page write without its CSRF
    header is 403 ``csrf_rejected``."""
    from app.auth import TokenScopeResolver, Unauthorized, hash_token
    from app.web.csrf import CsrfRejected
    from app.web.page_auth import page_session

    svc = services()
    try:
        scope = svc.scope_resolver.resolve(request.headers)
    except Unauthorized:
        try:
            session = page_session(svc.engine)
        except CsrfRejected as exc:
            from app.api.errors import ApiError

            raise ApiError(403, CsrfRejected.code, str(exc)) from None
        if session is None:
            raise
        return RequestContext(validate_scope_id(session.scope_id), Credential("session", session.id_sha256))
    if isinstance(svc.scope_resolver, TokenScopeResolver):  # it accepted the bearer token
        token = request.headers.get("Authorization", "").partition(" ")[2].strip()
        return RequestContext(validate_scope_id(scope), Credential("token", hash_token(token)))
    return RequestContext(validate_scope_id(scope))


def protect(blp: Blueprint) -> Blueprint:
    """Resolve the scope once before every request of ``blp`` (401 when nothing authenticates)."""

    @blp.before_request
    def _resolve_scope() -> None:
        g.memeflow_context = resolve_request()

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
