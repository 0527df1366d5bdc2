"""CSRF defence for the browser pages' POSTs: a same-origin check and a secret token.

Both must pass. The origin check: ``Sec-Fetch-Site``, when the browser sends it, must be
``same-origin``; ``Origin`` (or, without it, ``Referer``) must name this server's own origin; a POST
carrying neither is refused. The token: a signed-in browser (token mode) echoes its session's CSRF
secret; otherwise (``MEMEFLOW_AUTH=none``, the login form) a double-submit cookie — a random value in
an HttpOnly ``SameSite=Strict`` cookie that the form repeats in a hidden field. No server secret.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from flask import Response, g, request

CSRF_COOKIE = "mf_csrf"
CSRF_FIELD = "csrf_token"


class CsrfRejected(Exception):
    """The POST is not from this site's own page."""

    code = "csrf_rejected"
    status = 403


def _origin_of(url: str) -> str | None:
    """The origin ``url`` names; None when it names none (no scheme or host, or unparsable —
    ``http://[`` — which is then no match for this server's origin either)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def own_origin() -> str:
    """This server's origin as the browser addressed it (scheme per ``request.is_secure``)."""
    return f"{request.scheme}://{request.host}".lower()


def check_same_origin() -> None:
    """Raise :class:`CsrfRejected` unless the request provably comes from this origin."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site != "same-origin":
        raise CsrfRejected(f"cross-site request refused (Sec-Fetch-Site: {fetch_site})")
    origin = request.headers.get("Origin")
    if origin is not None:
        if _origin_of(origin) != own_origin():
            raise CsrfRejected("cross-origin request refused (Origin does not match this server)")
        return
    referer = request.headers.get("Referer")
    if referer is None:
        raise CsrfRejected("request refused: neither Origin nor Referer says it comes from this site")
    if _origin_of(referer) != own_origin():
        raise CsrfRejected("cross-origin request refused (Referer does not match this server)")


def csrf_token() -> str:
    """The token this page's forms must carry (the session's, or the double-submit cookie's)."""
    session = g.get("browser_session")
    if session is not None:
        return session.csrf_token
    if "csrf_cookie_value" not in g:
        value = request.cookies.get(CSRF_COOKIE, "")
        if not (20 <= len(value) <= 64 and value.isascii() and value.isprintable()):
            value = secrets.token_urlsafe(32)
            g.csrf_cookie_new = True
        g.csrf_cookie_value = value
    return g.csrf_cookie_value


def check_csrf_token() -> None:
    """Raise :class:`CsrfRejected` unless the form echoes the expected secret."""
    sent = request.form.get(CSRF_FIELD, "")
    session = g.get("browser_session")
    expected = session.csrf_token if session is not None else request.cookies.get(CSRF_COOKIE, "")
    if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise CsrfRejected("missing or wrong CSRF token: reload the page and try again")


def protect_post() -> None:
    """Both checks, for every state-changing browser request."""
    check_same_origin()
    check_csrf_token()


def set_csrf_cookie(response: Response) -> Response:
    """After a page minted a double-submit value, hand it to the browser (same attributes as the
    session cookie: HttpOnly, SameSite=Strict, Secure over TLS)."""
    if g.get("csrf_cookie_new"):
        response.set_cookie(CSRF_COOKIE, g.csrf_cookie_value, httponly=True, samesite="Strict",
                            secure=request.is_secure, path="/")
    return response
