"""Browser sign-in for token mode: ``/login`` exchanges a pasted API token for a session cookie,
``/logout`` deletes the session. The cookie opens the browser pages (/ops, the library at /), and
the API only for those pages' own same-origin requests (:mod:`app.web.page_auth`).

Cookie: ``mf_session`` (``__Host-mf_session`` over TLS), HttpOnly, ``SameSite=Strict``, ``Secure`` when the request came over TLS,
``Path=/``, lifetime ``MEMEFLOW_SESSION_TTL_S``. Both forms are CSRF-protected (same-origin check and
token), so a foreign page can neither sign a browser in to its own token nor sign it out.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, g, redirect, render_template, request, url_for

from app.web.csrf import CSRF_FIELD, CsrfRejected, protect_post, set_csrf_cookie
from app.web.sessions import (
    BrowserSession,
    close_session,
    open_session,
    request_session_cookie,
    session_cookie_name,
    session_for_cookie,
)

browser_bp = Blueprint("browser", __name__, template_folder="templates")
browser_bp.after_request(set_csrf_cookie)

DEFAULT_SESSION_TTL_S = 12 * 3600.0


def load_browser_session(engine: Any) -> BrowserSession | None:
    """The live session named by this request's cookie (cached on ``g``), or None."""
    if not g.get("browser_session_loaded"):
        g.browser_session = session_for_cookie(engine, request_session_cookie(request))
        g.browser_session_loaded = True
    return g.browser_session


def safe_next(value: str | None) -> str:
    """Where to go after signing in: the library (``/``, ``/?…``, ``/library…``) or /ops only (no
    open redirect); by default /ops."""
    if value and value.isprintable() and "//" not in value and "\\" not in value and (
            value == "/" or value.startswith(("/?", "/ops", "/library"))):
        return value
    return url_for("ops.index")


def _ops():
    return current_app.extensions["memeflow_ops"]


def _session_ttl_s() -> float:
    settings = getattr(current_app.extensions.get("memeflow"), "settings", None)
    return float(getattr(settings, "session_ttl_s", DEFAULT_SESSION_TTL_S))


def _signed_in_already() -> bool:
    """True when /ops would open without a sign-in (MEMEFLOW_AUTH=none, or a live session)."""
    try:
        _ops().scope_for_request()
    except Exception:  # noqa: BLE001 - any refusal means "show the form"
        return False
    return True


def _form(message: str | None = None, status: int = 200) -> Any:
    g.ops_scope = None
    return render_template("ops/login.html", message=message, next=safe_next(request.values.get("next")),
                           refresh=False, csrf_field=CSRF_FIELD), status


@browser_bp.get("/login")
def login_form() -> Any:
    """The sign-in page (in ``none`` mode, or already signed in: straight to /ops)."""
    if _signed_in_already():
        return redirect(safe_next(request.args.get("next")), code=303)
    return _form()


@browser_bp.post("/login")
def login() -> Any:
    """Exchange the pasted token for a session cookie (401 and the form again when it is refused)."""
    try:
        protect_post()
    except CsrfRejected as exc:
        return _form(str(exc), 403)
    opened = open_session(_ops().engine(), request.form.get("token", ""), _session_ttl_s())
    if opened is None:
        return _form("unknown or revoked token", 401)
    cookie_value, _session = opened
    # a sign-in replaces this browser's session: the previous one (signed in already, or a
    # planted cookie) is deleted, never left open beside the new one
    close_session(_ops().engine(), request_session_cookie(request))
    response = redirect(safe_next(request.form.get("next")), code=303)
    response.set_cookie(session_cookie_name(request.is_secure), cookie_value, max_age=int(_session_ttl_s()), httponly=True,
                        samesite="Strict", secure=request.is_secure, path="/")
    return response


@browser_bp.post("/logout")
def logout() -> Any:
    """Delete this browser's session row and its cookie."""
    load_browser_session(_ops().engine())
    try:
        protect_post()
    except CsrfRejected as exc:
        return _form(str(exc), 403)
    close_session(_ops().engine(), request_session_cookie(request))
    g.browser_session = None
    response = redirect(url_for("browser.login_form"), code=303)
    response.delete_cookie(session_cookie_name(request.is_secure), path="/", httponly=True, samesite="Strict",
                           secure=request.is_secure)
    return response
