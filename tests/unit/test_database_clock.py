"""DatabaseClock (app/orchestrator/clock.py): one reading of the database's clock, extended with the
monotonic clock, read again every refresh_s; the wall clock only until a first reading succeeds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from app.orchestrator.clock import DatabaseClock

DB_T0 = datetime(2030, 5, 1, 12, 0, tzinfo=timezone.utc)
WALL = datetime(2030, 5, 1, 11, 50, tzinfo=timezone.utc)  # this host runs 10 minutes behind


class Fake:
    def __init__(self) -> None:
        self.mono = 100.0
        self.reads = 0
        self.down = False

    def monotonic(self) -> float:
        return self.mono

    def read(self, _engine) -> datetime:
        self.reads += 1
        if self.down:
            raise OSError("connection refused")
        return DB_T0 + timedelta(seconds=self.mono - 100.0)


def _clock(fake: Fake) -> DatabaseClock:
    return DatabaseClock(None, refresh_s=60.0, retry_s=5.0, monotonic=fake.monotonic, wall=lambda: WALL,
                         read=fake.read)


def test_readings_are_the_databases_and_advance_with_the_monotonic_clock():
    fake = Fake()
    clock = _clock(fake)
    assert clock() == DB_T0
    fake.mono += 30.5
    assert clock() == DB_T0 + timedelta(seconds=30.5)
    assert fake.reads == 1  # no round trip per reading
    fake.mono += 30.0
    assert clock() == DB_T0 + timedelta(seconds=60.5)
    assert fake.reads == 2  # read again after refresh_s


def test_the_wall_clock_is_used_only_until_the_database_answers():
    fake = Fake()
    fake.down = True
    clock = _clock(fake)
    assert clock() == WALL
    fake.mono += 1.0
    assert clock() == WALL and fake.reads == 1  # not retried before retry_s
    fake.down = False
    fake.mono += 5.0
    assert clock() == DB_T0 + timedelta(seconds=6.0)


def test_a_failed_refresh_keeps_the_last_reading():
    fake = Fake()
    clock = _clock(fake)
    clock()
    fake.down = True
    fake.mono += 61.0
    assert clock() == DB_T0 + timedelta(seconds=61.0)  # extended, never back to the skewed wall clock
