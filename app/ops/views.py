"""/ops blueprint. Reads go through :mod:`app.ops.queries`; the one write (retry) goes through the
orchestrator's ``retry_job``. The scope comes from the same trusted resolver as the API's, or, in
token mode, from a browser session opened at ``/login`` (:mod:`app.ops.login`). GETs change nothing;
every POST passes the same-origin and CSRF checks of :mod:`app.web.csrf` first."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    abort,
    current_app,
    g,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)

from app.auth import Unauthorized
from app.ops import queries
from app.ops.login import browser_bp, load_browser_session
from app.web.csrf import CsrfRejected, csrf_token, protect_post, set_csrf_cookie
from app.web.headers import install_security_headers, mark_user_file

log = logging.getLogger("memeflow.ops")

ops_bp = Blueprint("ops", __name__, url_prefix="/ops", template_folder="templates", static_folder="static")
ops_bp.after_request(set_csrf_cookie)

FLASH_COOKIE = "mf_flash"
FLASH_MAX_CHARS = 500

ScopeGetter = Callable[[], str]
RetryFn = Callable[[str, uuid.UUID], Any]


@dataclass
class OpsConfig:
    """What the page needs from the application, wired once by :func:`register_ops`."""

    engine: Callable[[], Any]
    scope_for_request: ScopeGetter
    retry_job: RetryFn
    slot_limits: Callable[[], dict[str, int | None]]
    content_url: Callable[[uuid.UUID], str]
    settings: Callable[[], Any]  # sweep interval and worker TTL for the liveness panel


def _services() -> Any:
    return current_app.extensions["memeflow"]


def _default_scope() -> str:
    """The API's resolver (the same trusted headers, the same scope); without an Authorization
    header, a live browser session's scope (token mode). Fails closed when neither resolves."""
    from app.scopes import validate_scope_id

    try:
        return validate_scope_id(_services().scope_resolver.resolve(request.headers))
    except Unauthorized:
        if "Authorization" in request.headers:
            raise
        session = load_browser_session(_cfg().engine())
        if session is None:
            raise
        return validate_scope_id(session.scope_id)


def _default_retry(scope_id: str, job_id: uuid.UUID) -> Any:
    """The API's retry, counted against the same per-minute processing limit as
    ``POST /api/v1/jobs/{id}/retry`` (the bearer's or the signed-in session's token window)."""
    from app.api.context import rate_key

    svc = _services()
    key = rate_key(_default_settings(), scope_id, load_browser_session(_cfg().engine()))
    svc.orchestrator.take_request("processing", scope_id, key)
    result = svc.orchestrator.retry_job(scope_id, job_id)
    try:  # publish after commit; a failure is repaired by the sweep
        svc.publisher.publish(list(getattr(result, "hints", []) or []))
    except Exception:
        log.exception("hint publish after /ops retry failed; the sweep will re-hint")
    return result


def _default_settings() -> Any:
    settings = getattr(current_app.extensions.get("memeflow"), "settings", None)
    if settings is None:
        from app.config import get_settings

        settings = get_settings()
    return settings


def _default_slot_limits() -> dict[str, int | None]:
    settings = _default_settings()
    limit = getattr(settings, "agent_slots", None)  # the limit in force (unset = by provider kind)
    return {"agent": (settings.agent_lane_limit if limit is None else limit) or None}


def register_ops(
    app: Flask,
    *,
    scope_for_request: ScopeGetter | None = None,
    engine: Any = None,
    retry_job: RetryFn | None = None,
    slot_limits: dict[str, int | None] | None = None,
    content_url: Callable[[uuid.UUID], str] | None = None,
    settings: Any = None,
) -> None:
    """Mount /ops on ``app``.

    Defaults use ``app.extensions["memeflow"]`` as built by the API factory: its ``engine``, its
    ``scope_resolver`` (so /ops has the API's auth) and its ``orchestrator.retry_job`` + ``publisher``.
    Pass explicit callables to mount the page on another app (tests, a separate ops server).
    """
    def engine_getter() -> Any:
        return engine if engine is not None else _services().engine

    app.extensions["memeflow_ops"] = OpsConfig(
        engine=engine_getter,
        scope_for_request=scope_for_request or _default_scope,
        retry_job=retry_job or _default_retry,
        slot_limits=(lambda: slot_limits) if slot_limits is not None else _default_slot_limits,
        content_url=content_url or (lambda image_id: url_for("ops.image_content", image_id=image_id)),
        settings=(lambda: settings) if settings is not None else _default_settings,
    )
    app.jinja_env.filters.setdefault("pretty_json", _pretty_json)
    app.jinja_env.filters.setdefault("age", _age)
    app.jinja_env.globals.setdefault("csrf_token", csrf_token)
    install_security_headers(app)
    app.register_blueprint(ops_bp)
    app.register_blueprint(browser_bp)


def _cfg() -> OpsConfig:
    return current_app.extensions["memeflow_ops"]


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def resolve_page_scope() -> Any:
    """Set ``g.ops_scope`` for a browser page (/ops, the library); None, or the response for a
    browser without credentials (GET: to /login and back; otherwise a 401 page)."""
    try:
        g.ops_scope = _cfg().scope_for_request()
    except Exception as exc:
        status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
        if not (status == 401 or getattr(exc, "code", None) == "unauthorized"):
            raise
        if request.method == "GET" and "Authorization" not in request.headers:
            return redirect(url_for("browser.login_form", next=request.full_path.rstrip("?")), code=303)
        return render_template("ops/error.html", title="unauthorized", message=str(exc) or "unauthorized"), \
            401, {"WWW-Authenticate": "Bearer"}
    return None


@ops_bp.before_request
def _resolve_scope() -> Any:
    """Scope first (a browser without credentials is sent to /login), then the POST checks."""
    if request.endpoint == "ops.static":  # the stylesheet, also needed by the sign-in page
        return None
    refused = resolve_page_scope()
    if refused is not None:
        return refused
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        try:
            protect_post()
        except CsrfRejected as exc:
            return render_template("ops/error.html", title="forbidden", message=str(exc)), 403
    return None


def _with_flash(response: Response, kind: str, message: str) -> Response:
    """Hand the next /ops page a notice (a retry's outcome) in a short-lived cookie, not in the URL:
    a link from anywhere could put any words it liked in a ``?msg=`` notice. Shown once."""
    value = base64.urlsafe_b64encode(json.dumps({"kind": kind, "text": message[:FLASH_MAX_CHARS]}).encode())
    response.set_cookie(FLASH_COOKIE, value.decode("ascii"), max_age=60, httponly=True, samesite="Strict",
                        secure=request.is_secure, path=ops_bp.url_prefix)
    return response


def _take_flash() -> tuple[str | None, str | None]:
    """(notice, error notice) from this request's flash cookie; (None, None) without a usable one."""
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None, None
    try:
        flash = json.loads(base64.urlsafe_b64decode(raw.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        return None, None
    if not isinstance(flash, dict) or not isinstance(flash.get("text"), str):
        return None, None
    text_ = flash["text"][:FLASH_MAX_CHARS]
    return (text_, None) if flash.get("kind") == "msg" else (None, text_)


@ops_bp.get("")
@ops_bp.get("/")
def index() -> Any:
    cfg = _cfg()
    data = queries.overview(cfg.engine(), g.ops_scope, cfg.slot_limits(), cfg.settings())
    flash, flash_error = _take_flash()
    response = make_response(render_template(
        "ops/index.html", o=data, stages=list(data.funnel), flash=flash, flash_error=flash_error,
    ))
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(FLASH_COOKIE, path=ops_bp.url_prefix, httponly=True, samesite="Strict",
                               secure=request.is_secure)
    return response


@ops_bp.get("/images/<uuid:image_id>")
def image(image_id: uuid.UUID) -> Any:
    cfg = _cfg()
    detail = queries.image_detail(cfg.engine(), g.ops_scope, image_id)
    if detail is None:
        abort(404)
    return render_template("ops/image.html", d=detail, content_url=cfg.content_url(image_id), scope_id=g.ops_scope)


@ops_bp.get("/images/<uuid:image_id>/content")
def image_content(image_id: uuid.UUID) -> Any:
    """The image's bytes for the page's scope: a signed-in browser has a cookie, not a bearer token,
    and the API takes only the latter."""
    from app.api.images import original_file_name
    from app.api.queries import image_file
    from app.api.stored import read_original

    store = getattr(current_app.extensions.get("memeflow"), "store", None)
    row = image_file(_cfg().engine(), g.ops_scope, image_id)
    if row is None or store is None:
        abort(404)
    try:
        data = read_original(store, row.storage_key)  # 503 storage_corrupt: never other bytes
    except FileNotFoundError:
        abort(404)
    response = current_app.response_class(data, mimetype=row.media_type)
    response.set_etag(row.sha256)
    response.headers["Cache-Control"] = "private, no-cache"
    mark_user_file(response, original_file_name(image_id, row.media_type))
    return response.make_conditional(request)


@ops_bp.post("/jobs/<uuid:job_id>/retry")
def retry(job_id: uuid.UUID) -> Any:
    """The page's only write: an explicit human retry through the orchestrator."""
    try:
        result = _cfg().retry_job(g.ops_scope, job_id)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if not isinstance(code, str):
            raise
        return _with_flash(redirect(url_for("ops.index"), code=303), "err", f"{code}: {exc}")
    job = getattr(result, "job", None) or {}
    new_id = job.get("id") if isinstance(job, dict) else None
    msg = f"retry requested for job {job_id}" + (f" → new job {new_id}" if new_id else "")
    return _with_flash(redirect(url_for("ops.index"), code=303), "msg", msg)
