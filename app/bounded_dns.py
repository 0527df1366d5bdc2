"""Name resolution waited for until a deadline, in small thread pools — one per purpose.

The system resolver (``socket.getaddrinfo``) has no timeout of ours: a nameserver that never
answers holds the calling thread until the resolver's own retries give up (tens of seconds). Every
lookup of a name someone else controls — an agent provider's, a webhook receiver's — goes through
:func:`getaddrinfo_by` instead: it runs in a pool thread and is waited for only until the caller's
deadline (``TimeoutError`` after). A lookup abandoned at its deadline finishes in its pool thread;
with every thread of a pool stuck, later lookups of that purpose queue and end at their own
deadlines — never more threads. Pools are per purpose, so a receiver's hostile nameserver cannot
starve the agent's lookups (or the reverse). Address literals never reach a pool.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

__all__ = ["RESOLVER_THREADS", "getaddrinfo_by"]

#: Threads per purpose's pool, shared by the whole process.
RESOLVER_THREADS = 4
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(purpose: str) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(purpose)
        if pool is None:
            pool = _pools[purpose] = ThreadPoolExecutor(max_workers=RESOLVER_THREADS,
                                                        thread_name_prefix=f"{purpose}-resolver")
        return pool


def _forget_pools() -> None:
    """In a forked child: the parent's pool threads do not exist here, and a submit to their queue
    would never run (every lookup would end at its deadline); the child makes its own."""
    global _pools, _pools_lock
    _pools, _pools_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)


def getaddrinfo_by(
    purpose: str, deadline: float, host: str, port: Any, family: int = 0, kind: int = 0,
) -> list[tuple[Any, ...]]:
    """``socket.getaddrinfo(host, port, family, kind)`` waited for until ``deadline``
    (``time.monotonic()``) at most, in ``purpose``'s pool. ``TimeoutError`` past the deadline;
    ``socket.gaierror`` when the name does not resolve or is not a valid host name."""
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, family, kind)
    try:
        host.encode("idna")
    except UnicodeError:
        raise socket.gaierror(socket.EAI_NONAME, f"not a valid host name: {host!r}") from None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed before name resolution")
    pending = _pool(purpose).submit(socket.getaddrinfo, host, port, family, kind)
    try:
        return pending.result(timeout=left)
    except FutureTimeout:
        pending.cancel()  # still queued: never runs; already running: its answer is dropped
        raise TimeoutError(f"the name {host!r} did not resolve before the deadline") from None
