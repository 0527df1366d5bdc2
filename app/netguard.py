"""Network-exposure guards: who may reach an instance, decided before it serves anyone.

* :func:`check_bind` — with ``MEMEFLOW_AUTH=none`` every request is scope ``local`` with full
  rights, so binding anything but a loopback address is refused unless the operator opts in with
  ``MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1``. ``memeflow api``, ``memeflow up``/``demo`` (the
  Stack) and gunicorn (:mod:`app.api.gunicorn_conf`, before it opens a socket) all call it.
* :func:`allowed_hosts` / :func:`host_allowed` — the Host-header allow-list the API enforces on
  every request. A loopback bind alone does not stop DNS rebinding: a web page on
  ``evil.example`` re-resolves its own name to 127.0.0.1 and the browser then sends same-origin
  requests to the local instance with ``Host: evil.example``; refusing unknown Host values ends it.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from app.config import SettingsError

DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1")
_ANY_ADDRESS = {"", "0.0.0.0", "::", "*"}


class UnsafeBind(SettingsError):
    """A bind address that would expose an unauthenticated instance beyond this machine."""


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address, ``localhost`` or a name) reaches only this machine.

    A name counts when every address it resolves to is loopback; a name that does not resolve
    counts as remote (fail closed). ``unix:`` sockets are local by construction."""
    host = (host or "").strip()
    if host.startswith("unix:"):
        return True
    host = host.strip("[]")
    if host in _ANY_ADDRESS:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def split_bind(bind: str) -> str:
    """The host part of a gunicorn-style bind (``host:port``, ``[v6]:port``, ``unix:path``)."""
    bind = bind.strip()
    if bind.startswith("unix:"):
        return bind
    if bind.startswith("["):
        return bind[1:bind.index("]")] if "]" in bind else bind
    if bind.count(":") == 1:
        return bind.rsplit(":", 1)[0]
    return bind  # a bare address (IPv6 without port, or a host without port)


def check_bind(settings: Any, host: str, *, what: str = "the API") -> None:
    """Refuse (``UnsafeBind``) to serve ``what`` unauthenticated on a non-loopback ``host``."""
    if settings.auth != "none" or settings.allow_unauthenticated_remote or is_loopback(host):
        return
    raise UnsafeBind(
        f"refusing to serve {what} on {host or '0.0.0.0'!s} with MEMEFLOW_AUTH=none: anyone who can reach "
        "that address would have full access. Bind 127.0.0.1 (MEMEFLOW_API_HOST), use MEMEFLOW_AUTH=token "
        "(memeflow tokens create …), or set MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1 if a trusted network "
        "or proxy guards it."
    )


def allowed_hosts(settings: Any, bind_host: str | None = None) -> frozenset[str] | None:
    """The Host names the API answers (lower case, no port); ``None`` means any (``*``).

    ``MEMEFLOW_ALLOWED_HOSTS`` (comma separated; ``.example.com`` also allows its subdomains)
    replaces the default: localhost, 127.0.0.1, ::1 and the bind address when it is a specific one."""
    if settings.allowed_hosts:
        names = {n.strip().lower().strip("[]") for n in settings.allowed_hosts.split(",") if n.strip()}
        return None if "*" in names else frozenset(names)
    names = set(DEFAULT_ALLOWED_HOSTS)
    bind = (bind_host if bind_host is not None else settings.api_host or "").strip().strip("[]").lower()
    if bind not in _ANY_ADDRESS:
        names.add(bind)
    return frozenset(names)


def host_allowed(host_header: str | None, allowed: frozenset[str] | None) -> bool:
    """Whether a request's ``Host`` header (with or without port) names this instance."""
    if allowed is None:
        return True
    host = (host_header or "").strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    host = host.rstrip(".")
    if not host:
        return False
    return host in allowed or any(n.startswith(".") and (host.endswith(n) or host == n[1:]) for n in allowed)
