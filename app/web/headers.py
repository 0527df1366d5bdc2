"""Security headers on every response of the app: JSON, errors, HTML pages, static files, metrics.

One ``after_request`` hook. HTML gets a self-only Content-Security-Policy; everything else gets
``default-src 'none'`` (a JSON body or a script file opened as a page can run nothing). Framing is
denied twice (``X-Frame-Options`` for old browsers, ``frame-ancestors`` for current ones). A response
that sets no caching policy of its own gets ``Cache-Control: no-store``: pages and API answers hold a
scope's private data (names, captions, OCR text, search hits), which no shared cache may hand to
another user and no browser should keep on disk after sign-out. HSTS only
when the request arrived over TLS, which behind a reverse proxy needs ``MEMEFLOW_TRUSTED_PROXY_HOPS``
(see :func:`trust_proxies`).
"""

from __future__ import annotations

from flask import Flask, Response, request
from werkzeug.middleware.proxy_fix import ProxyFix

# Scripts and styles from this origin only: the /ops pages and the Swagger UI page carry no inline
# script or style (their CSS and JS are files served by memeflow). Images: thumbnails from /ops and
# Swagger UI's data: icons.
HTML_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
NON_HTML_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# Stored bytes (originals, thumbnails): also sandboxed, so that even a browser that took them for a
# document would run nothing and give it an opaque origin, never memeflow's.
USER_FILE_CSP = NON_HTML_CSP + "; sandbox"
HSTS = "max-age=31536000"
DEFAULT_CACHE_CONTROL = "no-store"

COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    # No other origin may embed anything of ours (an <img> of a stored file, a <script> of a JSON
    # answer): in none mode the files need no credential, so another site could show or probe them.
    "Cross-Origin-Resource-Policy": "same-origin",
}


def apply_security_headers(response: Response) -> Response:
    """Set the headers on one response (a view's explicit CSP is kept: it may only be stricter)."""
    for name, value in COMMON_HEADERS.items():
        response.headers[name] = value
    if "Content-Security-Policy" not in response.headers:
        html = response.mimetype == "text/html"
        response.headers["Content-Security-Policy"] = HTML_CSP if html else NON_HTML_CSP
    if "Cache-Control" not in response.headers:  # static files, thumbnails, content: their own policy
        response.headers["Cache-Control"] = DEFAULT_CACHE_CONTROL
    if request.is_secure:
        response.headers["Strict-Transport-Security"] = HSTS
    return response


def mark_user_file(response: Response, filename: str) -> Response:
    """Headers for a response that carries an uploaded image's bytes (or a thumbnail made from them).

    Its Content-Type is the media type sniffed from the bytes at upload (never the client's) and
    ``nosniff`` stands for every response; on top of that, a ``sandbox`` CSP and an ``inline``
    disposition with a file name of our making (``filename``: an id and an extension, never the
    user's display name, which could break out of the header's quotes)."""
    response.headers["Content-Security-Policy"] = USER_FILE_CSP
    response.headers["Content-Disposition"] = f'inline; filename="{filename}"'
    return response


def install_security_headers(app: Flask) -> None:
    """Register the hook once per app (the API factory and ``register_ops`` both call this)."""
    if app.extensions.get("memeflow_security_headers"):
        return
    app.extensions["memeflow_security_headers"] = True
    app.after_request(apply_security_headers)


def trust_proxies(app: Flask, hops: int) -> None:
    """Believe ``X-Forwarded-Proto``/``-For`` from ``hops`` reverse proxies (0: believe none), so that
    a TLS-terminating proxy makes ``request.is_secure`` true (HSTS, Secure cookies, origin checks)."""
    if hops > 0:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops)  # type: ignore[method-assign]
