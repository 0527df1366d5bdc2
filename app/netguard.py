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

from app.bounded_dns import getaddrinfo_by
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


# ---------------------------------------------------------------------------- outbound (SSRF)
#: Longest webhook URL accepted.
OUTBOUND_URL_MAX = 2048


class OutboundRefused(ValueError):
    """An outbound URL memeflow will not call; ``code`` is the API's stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def allowed_networks(raw: str | None) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Parse ``MEMEFLOW_WEBHOOK_ALLOWED_NETWORKS`` (comma-separated CIDRs) — the operator's explicit
    exceptions to the public-addresses-only rule (e.g. ``127.0.0.0/8`` for a receiver on this host)."""
    nets = []
    for part in (raw or "").split(","):
        if part.strip():
            try:
                nets.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise SettingsError(f"MEMEFLOW_WEBHOOK_ALLOWED_NETWORKS: {part.strip()!r} is not a CIDR") from None
    return tuple(nets)


#: NAT64's well-known prefix (RFC 6052): the last 32 bits are the IPv4 address a gateway reaches.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def outbound_address_allowed(address: str, networks: tuple = ()) -> bool:
    """A public (global unicast) address, or one inside an explicitly allowed network. Loopback,
    private, link-local (cloud metadata 169.254.169.254), CGNAT, multicast, reserved and unspecified
    addresses are refused; an IPv6 address that carries an IPv4 one to a gateway (IPv4-mapped, 6to4,
    NAT64's 64:ff9b::/96) is judged as that IPv4 address, and the rest of the reserved IPv6 space
    (IPv4-compatible ``::a.b.c.d``, local-use NAT64, deprecated site-local) is refused."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6:
        if ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        else:
            ip = ip.ipv4_mapped or ip.sixtofour or ip
    if any(ip.version == net.version and ip in net for net in networks):
        return True
    return ip.is_global and not ip.is_multicast and not ip.is_reserved and not (ip.version == 6 and ip.is_site_local)


def check_outbound_url(
    url: str, networks: tuple = (), *, resolve: bool = True, deadline: float | None = None,
) -> tuple[str, str, int, list[str]]:
    """Validate an outbound http(s) URL and resolve it: (scheme, host, port, allowed addresses).

    ``deadline`` (``time.monotonic()``): the lookup is waited for until then at most, in the
    ``webhooks`` resolver pool (:mod:`app.bounded_dns`), and ``TimeoutError`` is raised after — a
    receiver's stalling nameserver holds no caller longer than that.

    Raises :class:`OutboundRefused` with ``invalid_webhook_url`` (not http(s), no host, credentials
    in it, bad port), ``webhook_url_too_long``, ``webhook_url_unresolvable`` or
    ``webhook_url_forbidden`` (any address it resolves to is not allowed: fail closed). Called when a
    subscription is created *and* before every delivery, whose connection then goes to the returned
    addresses only (so a DNS answer that changes after the check cannot redirect it)."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or len(url) > OUTBOUND_URL_MAX:
        raise OutboundRefused("webhook_url_too_long", f"a webhook URL has at most {OUTBOUND_URL_MAX} characters")
    if not url.isprintable() or any(ch.isspace() for ch in url):
        raise OutboundRefused("invalid_webhook_url", "the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise OutboundRefused("invalid_webhook_url", "the URL cannot be parsed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise OutboundRefused("invalid_webhook_url", "a webhook URL must be http:// or https://")
    if not parts.hostname:
        raise OutboundRefused("invalid_webhook_url", "the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("invalid_webhook_url", "credentials do not belong in a webhook URL (deliveries are signed)")
    host = parts.hostname
    port = port or (443 if scheme == "https" else 80)
    if not resolve:
        return scheme, host, port, []
    try:
        if deadline is None:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        else:
            infos = getaddrinfo_by("webhooks", deadline, host, port, 0, socket.SOCK_STREAM)
    except TimeoutError:
        raise
    except (OSError, UnicodeError):
        raise OutboundRefused("webhook_url_unresolvable", f"the host {host!r} does not resolve") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise OutboundRefused("webhook_url_unresolvable", f"the host {host!r} does not resolve")
    if not all(outbound_address_allowed(a, networks) for a in addresses):
        raise OutboundRefused(
            "webhook_url_forbidden",
            "the URL resolves to a loopback, private, link-local or otherwise non-public address "
            "(an operator may allow networks with MEMEFLOW_WEBHOOK_ALLOWED_NETWORKS)",
        )
    return scheme, host, port, addresses
