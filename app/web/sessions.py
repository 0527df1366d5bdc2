"""Browser sessions for token mode: a pasted API token is exchanged for a random cookie.

Only the cookie's sha256 is stored, with the id of the token that opened the session; the lookup
joins ``api_tokens`` on every request, so revoking the token ends the session at once (and deleting
it cascades). The session carries its own CSRF secret. The cookie is honoured by the browser pages
(/ops, the library at /) and by the API only for requests made by those pages' own scripts
(:mod:`app.web.page_auth`: same origin, plus the CSRF header on writes); any other API client
needs ``Authorization: Bearer``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

from app.auth import hash_token

SESSION_COOKIE = "mf_session"
# Over TLS the cookie is ``__Host-`` prefixed: a browser accepts it only Secure, for ``Path=/`` and this
# exact host, so a sibling subdomain or a plain-HTTP man in the middle cannot plant one (a session of
# their own token) that the pages would honour; a plain ``mf_session`` is ignored over TLS.
SECURE_SESSION_COOKIE = "__Host-mf_session"


def session_cookie_name(secure: bool) -> str:
    """The session cookie's name for a request that came over TLS (``secure``) or not."""
    return SECURE_SESSION_COOKIE if secure else SESSION_COOKIE


def request_session_cookie(request) -> str | None:
    """The value of the session cookie this request may carry (by its scheme), if any."""
    return request.cookies.get(session_cookie_name(request.is_secure))
MAX_TOKEN_CHARS = 256

# -- open_session: the token's row, if live, becomes a session; expired sessions are dropped --
OPEN_SESSION = text("""
    WITH expired AS (DELETE FROM browser_sessions WHERE expires_at <= now())
    INSERT INTO browser_sessions (id_sha256, token_id, csrf_token, expires_at)
    SELECT :sid, t.id, :csrf, least(now() + make_interval(secs => :ttl), t.expires_at)
      FROM api_tokens t
     WHERE t.token_sha256 = :digest AND t.revoked_at IS NULL
       AND (t.expires_at IS NULL OR t.expires_at > now())
    RETURNING token_id, csrf_token, expires_at,
              (SELECT scope_id FROM api_tokens WHERE id = token_id) AS scope_id
""")

# -- session_for_cookie: a live session of a live token; the scope is the token's --
LIVE_SESSION = text("""
    SELECT s.id_sha256, s.token_id, s.csrf_token, s.expires_at, t.scope_id, t.token_sha256
      FROM browser_sessions s
      JOIN api_tokens t ON t.id = s.token_id
     WHERE s.id_sha256 = :sid AND s.expires_at > now() AND t.revoked_at IS NULL
       AND (t.expires_at IS NULL OR t.expires_at > now())
""")

CLOSE_SESSION = text("DELETE FROM browser_sessions WHERE id_sha256 = :sid")


@dataclass(frozen=True)
class BrowserSession:
    """A signed-in browser: the scope of the token that opened it and its CSRF secret."""

    token_id: uuid.UUID
    scope_id: str
    csrf_token: str
    token_sha256: str = ""  # the token's digest: a session shares its token's rate-limit window
    id_sha256: str = ""  # the cookie's digest (the row's key): to ask later whether it is still live


def _digest(cookie_value: str) -> str:
    return hashlib.sha256(cookie_value.encode("utf-8")).hexdigest()


def _plausible(value: str | None) -> bool:
    return bool(value) and len(value) <= MAX_TOKEN_CHARS and value.isascii() and value.isprintable()


def open_session(engine: Engine, token: str, ttl_s: float) -> tuple[str, BrowserSession] | None:
    """Exchange an API token for (cookie value, session); None when the token is unknown or revoked."""
    token = token.strip()
    if not _plausible(token):
        return None
    cookie_value = secrets.token_urlsafe(32)
    digest = hash_token(token)
    with engine.begin() as conn:
        row = conn.execute(OPEN_SESSION, {"sid": _digest(cookie_value), "csrf": secrets.token_urlsafe(32),
                                          "ttl": float(ttl_s), "digest": digest}).first()
    if row is None:
        return None
    return cookie_value, BrowserSession(token_id=row.token_id, scope_id=row.scope_id, csrf_token=row.csrf_token,
                                        token_sha256=digest, id_sha256=_digest(cookie_value))


def session_for_cookie(engine: Engine, cookie_value: str | None) -> BrowserSession | None:
    """The live session this cookie names, or None (unknown, expired, or its token revoked)."""
    if not _plausible(cookie_value):
        return None
    sid = _digest(cookie_value)  # type: ignore[arg-type]
    with engine.connect() as conn:
        row = conn.execute(LIVE_SESSION, {"sid": sid}).first()
    # Looked up by digest; compared again in constant time on the digest itself.
    if row is None or not hmac.compare_digest(row.id_sha256, sid):
        return None
    return BrowserSession(token_id=row.token_id, scope_id=row.scope_id, csrf_token=row.csrf_token,
                          token_sha256=row.token_sha256, id_sha256=row.id_sha256)


def session_live(engine: Engine, id_sha256: str) -> bool:
    """Whether the session with this cookie digest is still live (not signed out or expired, its
    token not revoked or expired): what a long stream opened with it asks again while it runs."""
    with engine.connect() as conn:
        return conn.execute(LIVE_SESSION, {"sid": id_sha256}).first() is not None


def close_session(engine: Engine, cookie_value: str | None) -> bool:
    """Delete the session this cookie names; whether a row was deleted."""
    if not _plausible(cookie_value):
        return False
    with engine.begin() as conn:
        return conn.execute(CLOSE_SESSION, {"sid": _digest(cookie_value)}).rowcount > 0  # type: ignore[arg-type]
