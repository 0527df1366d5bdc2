"""One supervised child process of :class:`app.cli.stack.Stack`, and the process helpers it uses.

A child runs in its own session (Ctrl-C in the terminal reaches only the supervisor, which stops
the children in order) and, on Linux, dies with the supervisor: ``PR_SET_PDEATHSIG`` makes the
kernel send it :attr:`Child.death_signal` when the supervisor dies without stopping it (SIGKILL,
the OOM killer), so no orphaned API keeps holding the port or workers keep consuming.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's ``prctl`` (Linux), resolved in the parent: the forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl  # the process's own symbols: libc's
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    fn.restype = ctypes.c_int
    return fn


_PRCTL = _prctl()


def _die_with_parent(sig: int):
    """A ``preexec_fn`` asking the kernel to send ``sig`` to the child when its parent dies
    (PR_SET_PDEATHSIG; None where unavailable: the child then only stops on an orderly stop).

    The kernel sends it when the *thread* that forked exits, so children are spawned from the
    supervisor's main thread only. A parent that died before the call leaves the child
    re-parented already: it signals itself."""
    prctl, parent = _PRCTL, os.getpid()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    port: int | None = None  # a TCP port that must accept connections for "started"
    stop_grace_s: float | None = None  # None: the stack's stop timeout
    death_signal: int = signal.SIGTERM  # sent by the kernel if the supervisor dies (Linux)
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session: Ctrl-C in the terminal reaches the supervisor only, which stops children
            # in order; the death signal stops them if the supervisor dies without doing so.
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent(self.death_signal),
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def listens_on(pid: int, port: int) -> bool | None:
    """Whether ``pid`` or one of its descendants listens on TCP ``port`` (None: cannot tell)."""
    try:
        import psutil

        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return True
        return False
    except Exception:  # noqa: BLE001 - psutil missing, access denied, or the process is gone
        return None


def descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
