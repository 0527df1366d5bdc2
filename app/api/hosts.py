"""Per-request exposure guards of the API (see :mod:`app.netguard`).

* A query string of raw bytes that are not UTF-8 is 400 ``invalid_query_string``.
* The Host-header allow-list (DNS-rebinding defence): an unknown Host is 400 ``invalid_host``.
* Without authentication (``MEMEFLOW_AUTH=none``: :class:`~app.auth.LocalScopeResolver`) and no
  opt-in, a request from a non-loopback peer is 403 ``unauthenticated_remote``. It is the second
  layer behind the bind guard, for servers started without memeflow's commands or gunicorn
  config (``gunicorn -b 0.0.0.0 app.api.wsgi:app``, ``flask run --host 0.0.0.0``).
* Without authentication, an API write (any method but GET/HEAD/OPTIONS) that a browser marks as coming
  from another site (``Sec-Fetch-Site`` other than ``same-origin``/``none``, or an ``Origin`` that is
  not this server's) is 403 ``cross_site_request``: nothing ambient (no token) would stop a web page
  the user visits from uploading to or deleting from the local library. The same holds for the
  events stream and long-poll, which a foreign page could not read but could hold open until the
  scope's stream slots are gone. Clients that are not
  browsers send neither header and are unaffected; in token mode a page cannot attach the bearer
  token, and the browser session's writes have their own CSRF check.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from flask import Flask, request

from app.api.errors import error_response
from app.netguard import allowed_hosts, host_allowed
from app.web.csrf import own_origin

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_SITE_FETCH = frozenset({"same-origin", "none"})  # none: the user typed or bookmarked it
# Reads that hold a bounded slot while they wait: a foreign page could not read them, only exhaust
# the slots the library page's own stream needs.
_SLOT_HOLDING_READS = ("/api/v1/events",)


def loopback_peer(addr: str | None) -> bool:
    """Whether the peer is this machine; no address at all means a unix socket, local too."""
    if not addr:
        return True
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _cross_site_write() -> bool:
    """Whether this request is a write, or a read that holds a slot (the events stream and
    long-poll), that a browser says another site's page made."""
    if not request.path.startswith("/api/"):
        return False  # the pages' forms have their own CSRF check (app.web.csrf)
    if request.method in _SAFE_METHODS and not request.path.startswith(_SLOT_HOLDING_READS):
        return False
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in _SAME_SITE_FETCH:
        return True
    origin = request.headers.get("Origin")
    return origin is not None and origin.rstrip("/").lower() != own_origin()


def _utf8(raw: bytes) -> bool:
    """Whether a raw query string is UTF-8: werkzeug decodes ``request.args`` strictly, so raw
    non-UTF-8 bytes (which gunicorn refuses on the request line, but the development server and
    other WSGI servers pass on) would be a UnicodeDecodeError — a 500 — wherever a view reads one."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def install_request_guards(app: Flask, settings: Any, scope_resolver: Any) -> None:
    """Register the guards as the first ``before_request`` hook (before auth and every view).

    "Unauthenticated" is decided by the resolver the app really uses, not by the setting alone."""
    from app.auth import LocalScopeResolver

    allowed = allowed_hosts(settings)
    unauthenticated = isinstance(scope_resolver, LocalScopeResolver)
    local_only = unauthenticated and not settings.allow_unauthenticated_remote

    @app.before_request
    def _guard_exposure():
        if not _utf8(request.query_string):
            return error_response(400, "invalid_query_string",
                                  "the query string holds raw bytes that are not UTF-8; percent-encode them")
        if allowed is not None and not host_allowed(request.host, allowed):
            return error_response(
                400, "invalid_host",
                "this server does not answer to that Host name; add it to MEMEFLOW_ALLOWED_HOSTS",
            )
        if local_only and not loopback_peer(request.remote_addr):
            return error_response(
                403, "unauthenticated_remote",
                "MEMEFLOW_AUTH=none serves this machine only; use MEMEFLOW_AUTH=token "
                "(or MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1 behind a trusted proxy)",
            )
        if unauthenticated and _cross_site_write():
            return error_response(
                403, "cross_site_request",
                "MEMEFLOW_AUTH=none refuses writes and event streams from other sites' pages "
                "(Origin / Sec-Fetch-Site); "
                "use this server's own pages, a non-browser client, or MEMEFLOW_AUTH=token",
            )
        return None
