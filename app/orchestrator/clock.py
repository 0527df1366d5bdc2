"""``now`` on the database's clock, for every process, without a round trip per reading.

Leases, backoff (``available_at``), re-hint grace, slot expiry and retry times are written by one
process and compared by another: a worker's claim asks ``available_at <= :now`` and
``lease_expires_at < :now`` with its own ``now``. Read from each host's wall clock, a worker whose
clock ran 10 minutes ahead took live leases from their holders (fenced them out mid-run), and one
10 minutes behind dropped every due hint (nothing "due" yet) and held expired slots. So the
orchestrator's default clock is PostgreSQL's: :class:`DatabaseClock` reads ``clock_timestamp()``
once, then extends that reading with the host's monotonic clock (which wall-clock steps and skew
never move), and reads it again every ``refresh_s``. A reading costs one short query on a
connection of its own (never one of the pool's, which the caller may be holding all of); its error
is half that query's round trip plus the monotonic clock's drift between readings (parts per
million). Until a first reading succeeds (the database is not up yet) the host's wall clock is
used, and a reading is tried again every ``retry_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from app.orchestrator.store.clock import read_clock

log = logging.getLogger(__name__)

#: How often the database's clock is read again (seconds).
REFRESH_S = 60.0
#: After a failed reading, how long until the next try (seconds).
RETRY_S = 5.0


def wall_clock() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(timezone.utc)


class DatabaseClock:
    """A callable ``now()`` on the database's clock (see the module's docstring). Thread-safe;
    one reading at a time (the others use the current one meanwhile)."""

    def __init__(self, engine: Engine, *, refresh_s: float = REFRESH_S, retry_s: float = RETRY_S,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] | None = None,
                 read: Callable[[Engine], datetime] | None = None) -> None:
        self._engine = engine
        self._refresh_s, self._retry_s = refresh_s, retry_s
        self._monotonic = monotonic
        self._wall = wall or (lambda: wall_clock())  # looked up per call (tests skew it)
        self._read = read or self._read_database
        self._side: Engine | None = None
        self._anchor: tuple[datetime, float] | None = None  # (database time, monotonic time then)
        self._next_reading = float("-inf")
        self._reading = threading.Lock()

    def __call__(self) -> datetime:
        mono = self._monotonic()
        if mono >= self._next_reading and self._reading.acquire(blocking=False):
            try:
                self._take_reading()
            finally:
                self._reading.release()
            mono = self._monotonic()
        anchor = self._anchor
        if anchor is None:
            return self._wall()
        return anchor[0] + timedelta(seconds=mono - anchor[1])

    def _take_reading(self) -> None:
        before = self._monotonic()
        try:
            db_time = self._read(self._engine)
        except Exception as exc:  # noqa: BLE001 - not reachable yet: keep the last reading, or the wall clock
            self._next_reading = self._monotonic() + self._retry_s
            log.warning("could not read the database's clock (%s): %s", type(exc).__name__,
                        "using the last reading" if self._anchor else "using this host's clock until it can")
            return
        after = self._monotonic()
        first = self._anchor is None
        self._anchor = (db_time, (before + after) / 2)
        self._next_reading = after + self._refresh_s
        if first:
            skew = (db_time - self._wall()).total_seconds()
            if abs(skew) > 1.0:
                log.warning("this host's clock is %.1f s %s the database's: memeflow uses the database's", abs(skew),
                            "behind" if skew > 0 else "ahead of")

    def _read_database(self, engine: Engine) -> datetime:
        if self._side is None:  # a connection of its own per reading: never one the caller may hold
            self._side = create_engine(engine.url, poolclass=NullPool,
                                       connect_args={"connect_timeout": 2, "options": "-c statement_timeout=5000"})
        with self._side.connect() as conn:
            return read_clock(conn)
