"""A provider call that never returns is cut off (SPEC §4.4 "nothing stuck").

A heartbeat extends a claim's lease for as long as its compute runs, so a model that deadlocks
or loops on one input would hold its task ``running`` — and, in a ``solo`` worker, the whole
worker — for ever, and the sweep would never recover it: its lease stays live. A Python thread
cannot be interrupted, so the watchdog ends the *process*:

- every provider call (``provider_call``: an embed of a visual or text batch, or of one half of a
  bisected one; an agent's describe or lookup) made for a Heartbeat's claims (``computing_for``)
  is armed with its lane's ``Settings.run_max_s`` while it runs;
- the process's beater thread (``app.worker.run._Beater``) finds a call past its deadline and calls
  ``overrun``: the claims' heartbeat stops for good, the overrun is logged (task ids, stage,
  provider, seconds) and noted on each claim the call computed for (all of a visual or text batch;
  one claim in an agent batch, whose calls are one claim's each), fenced — the task's error and its
  open agent attempt's say ``stage_timeout`` — then the process exits with ``STAGE_TIMEOUT_EXIT``.

From there the machinery of a worker death takes over (docs/architecture.md "A provider call
that never returns"): its supervisor (``memeflow up``, compose's restart policy, a prefork pool's
master) starts another, the lease lapses, the sweep re-hints, and the re-claim recovers the task
as after any death — a recall-safe call runs again alone and a poison input that hangs every time
ends ``max_attempts_exceeded``; a paid call that may have run ends ``unknown_execution``, never
repeated.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from app.config import STAGE_TIMEOUT_EXIT

__all__ = ["STAGE_TIMEOUT_EXIT", "Call", "computing_for", "overrun", "provider_call"]

log = logging.getLogger(__name__)

#: How long the overrun's fenced note may take before the process exits anyway (s): the database
#: may be what hangs.
NOTE_TIMEOUT_S = 5.0
#: The stored error's code.
STAGE_TIMEOUT = "stage_timeout"

_ids = itertools.count(1)
_local = threading.local()


@dataclass(frozen=True)
class Call:
    """One provider call in flight, armed with its deadline (``time.monotonic()``)."""

    id: int
    lane: str
    provider: str
    max_s: float
    started: float
    #: the claims the call computes for (an agent batch's calls are one claim's each); () = all of
    #: its Heartbeat's (a visual or text batch's embed serves them all)
    claims: tuple = ()

    @property
    def deadline(self) -> float:
        return self.started + self.max_s


@contextlib.contextmanager
def computing_for(hb: Any, claims: Iterable[Any] | None = None) -> Iterator[None]:
    """This thread computes for ``hb``'s claims — or only ``claims`` of them (an agent batch's call
    thread: one claim's call) —: its provider calls are armed on ``hb`` and, past their maximum,
    noted on those claims alone."""
    previous = getattr(_local, "hb", None), getattr(_local, "claims", ())
    _local.hb, _local.claims = hb, tuple(claims or ())
    try:
        yield
    finally:
        _local.hb, _local.claims = previous


def provider_name(provider: Any) -> str:
    """A provider's name for the log: its ``name``, else its class (a bound method's object's)."""
    obj = getattr(provider, "__self__", provider)
    return str(getattr(obj, "name", None) or type(obj).__name__)


@contextlib.contextmanager
def provider_call(lane: str, provider: Any) -> Iterator[None]:
    """Run one provider call of ``lane`` under the watchdog: armed on the Heartbeat this thread
    computes for (none outside a claim's compute: unwatched) with ``Settings.run_max_s(lane)``."""
    hb = getattr(_local, "hb", None)
    max_s = hb.orch.settings.run_max_s(lane) if hb is not None else 0.0
    if max_s <= 0:
        yield
        return
    call = Call(next(_ids), lane, provider_name(provider), max_s, time.monotonic(), getattr(_local, "claims", ()))
    hb.arm(call)
    try:
        yield
    finally:
        hb.disarm(call)


def overrun(hb: Any, call: Call) -> NoReturn:
    """``call`` ran past its maximum: stop ``hb``'s beats, note and log the overrun (fenced; both
    together at most ``NOTE_TIMEOUT_S``), end the process. Runs in the beater thread; never returns.

    The note and the log line each run in a thread of their own, waited for with a deadline: the
    database may be what hangs, and the hung thread may hold a logging handler's lock (blocked in a
    write to a stream that no longer drains) — the exit must wait on neither."""
    hb.stop_beating()  # every claim's: the process ends
    seconds = time.monotonic() - call.started
    overran = list(call.claims or hb.claims)  # an agent batch's other calls did not overrun: not noted
    stages = sorted({str(c.stage) for c in overran})
    error = {"code": "stage_timeout",
             "message": f"a {'/'.join(stages)} provider call ran past its maximum of {call.max_s:g} s; "
                        "its worker was ended and the task is recovered as after a worker death"}
    deadline = time.monotonic() + NOTE_TIMEOUT_S
    try:
        waits = [_daemon(_note, "stage-timeout-note", hb.orch, overran, error),
                 _daemon(_log_overrun, "stage-timeout-log", overran, call, seconds)]
        for thread in waits:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:  # even with no thread to be had (a leaking provider took them all): the worker must not stay hung
        end_process(STAGE_TIMEOUT_EXIT)


def _daemon(target: Any, name: str, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def _log_overrun(claims: list[Any], call: Call, seconds: float) -> None:
    for claim in claims:
        log.error(
            "a %s provider call ran past its maximum of %g s (%.1f s): ending this worker process (exit %d)",
            call.lane, call.max_s, seconds, STAGE_TIMEOUT_EXIT,
            extra={"task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id,
                   "stage": claim.stage, "generation": claim.generation, "code": STAGE_TIMEOUT,
                   "provider": call.provider, "seconds": round(seconds, 1)})


def _note(orch: Any, claims: list[Any], error: dict) -> None:
    try:
        orch.note_overrun(claims, error)
    except Exception:  # noqa: BLE001 - only a note: the exit and the recovery do not depend on it
        log.exception("could not record the stage timeout")


#: How long the exit waits for stdout and stderr to flush (s): a hung thread blocked in a write to
#: one that no longer drains holds its buffer's lock.
FLUSH_TIMEOUT_S = 1.0


def end_process(code: int) -> NoReturn:
    """End this process at once (no cleanup: a hung thread would block an orderly exit); what
    stdout and stderr buffer is flushed if that takes at most ``FLUSH_TIMEOUT_S``."""
    try:
        _daemon(_flush, "stage-timeout-flush").join(FLUSH_TIMEOUT_S)
    finally:
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):  # not logging.shutdown(): the hung thread may hold a handler's lock
        with contextlib.suppress(Exception):
            stream.flush()
