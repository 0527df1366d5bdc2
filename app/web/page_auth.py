"""The browser session as an API credential, for memeflow's own pages only (token mode).

The library page (``/``) calls ``/api/v1`` from its script (upload, search, context edit, events),
and a signed-in browser holds a session cookie, not a bearer token. The API honours that cookie
only when all of these hold, so that no other site — not even another port on the same host, which
is "same-site" for cookies — can use it:

* there is no ``Authorization`` header (a bearer token, good or bad, is never overridden);
* the request provably comes from this origin (:func:`app.web.csrf.check_same_origin`:
  ``Sec-Fetch-Site``, ``Origin``/``Referer``) — cross-origin reads and writes are refused alike;
* a write (anything but GET/HEAD/OPTIONS) echoes the session's CSRF secret in ``X-CSRF-Token``, a
  header no foreign form can send and no foreign script can set without a CORS grant we never give.
"""

from __future__ import annotations

import hmac
from typing import Any

from flask import g, request

from app.web.csrf import CsrfRejected, check_same_origin
from app.web.sessions import BrowserSession, request_session_cookie, session_for_cookie

CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def page_session(engine: Any) -> BrowserSession | None:
    """The session of a request made by this site's own page script, or None when the request does
    not qualify (no cookie, an Authorization header, another origin, unknown/expired session).

    Raises :class:`CsrfRejected` for a qualifying session whose write lacks the CSRF header."""
    if "Authorization" in request.headers or not request_session_cookie(request):
        return None
    try:
        check_same_origin()
    except CsrfRejected:
        return None
    session = session_for_cookie(engine, request_session_cookie(request))
    if session is None:
        return None
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not sent or not hmac.compare_digest(sent.encode(), session.csrf_token.encode()):
            raise CsrfRejected(f"missing or wrong {CSRF_HEADER} header: reload the page and try again")
    g.api_page_session = session
    return session
