"""Deployments a user assembles: `memeflow db upgrade` run twice at once (two deploy hosts, an
init container per API replica, a re-run `migrate` service) against one external PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.db.engine import make_engine, migration_status
from tests.conftest import poll_until

ROOT = Path(__file__).resolve().parents[2]


def _upgrade(url: str, redis_url: str, var_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "MEMEFLOW_DATABASE_URL": url, "MEMEFLOW_BROKER_URL": redis_url,
           "MEMEFLOW_VAR_DIR": str(var_dir), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _assert_at_head(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current, head = migration_status(conn)
    finally:
        engine.dispose()
    assert current == head


def test_two_concurrent_upgrades_both_succeed(fresh_db, services, tmp_path):
    url = fresh_db(None)  # an empty database: every migration still to run
    procs = [_upgrade(url, services.redis_url(), tmp_path / f"var{i}") for i in range(2)]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        outputs.append((proc.returncode, out))
    assert [rc for rc, _ in outputs] == [0, 0], [out[-800:] for _, out in outputs]
    _assert_at_head(url)


def test_upgrade_ignores_a_short_server_statement_timeout(fresh_db, services, tmp_path):
    """A managed PostgreSQL often sets a statement_timeout on the database or role (30 s is common):
    a migration that rewrites or indexes a large table outlives it, and the whole upgrade rolled
    back. The migration session sets its own (none), as the runtime sessions set theirs."""
    import psycopg2
    from sqlalchemy.engine import make_url

    url = fresh_db(None)
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    with conn.cursor() as cur:
        # stands in for "shorter than the slowest migration statement": every one outlives 1 ms here
        cur.execute(f"ALTER DATABASE {make_url(url).database} SET statement_timeout = '1ms'")
    conn.close()
    proc = _upgrade(url, services.redis_url(), tmp_path / "var")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-1500:]


def test_an_upgrade_behind_live_traffic_never_blocks_it_for_long_and_still_completes(fresh_db, services, tmp_path):
    """A rolling upgrade runs `db upgrade` while the old release serves. A migration's ALTER waits
    for the table lock behind a long transaction (a report, a slow search), and every statement of
    the live traffic on that table queued behind the ALTER: the whole service stalled for as long
    as the long transaction ran. The migration now gives up its wait after a short lock timeout,
    rolls back, lets the traffic through and tries again — it completes once the lock is free."""
    import psycopg2
    from alembic import command

    from app.db.engine import alembic_config

    url = fresh_db(None)
    command.upgrade(alembic_config(url), "0029")  # 0030 alters ops_counters
    dsn = url.replace("postgresql+psycopg2://", "postgresql://", 1)
    blocker = psycopg2.connect(dsn)
    with blocker.cursor() as cur:  # a long transaction that read the table: ACCESS SHARE held
        cur.execute("SELECT count(*) FROM ops_counters")
    proc = _upgrade(url, services.redis_url(), tmp_path / "var")
    watcher = psycopg2.connect(dsn)
    watcher.autocommit = True  # pg_stat_activity is read once per transaction: a fresh one per look
    try:
        def alter_waits() -> bool:
            with watcher.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query ILIKE '%ops_counters%' AND pid <> pg_backend_pid()")
                return cur.fetchone()[0] > 0

        poll_until(alter_waits, timeout=120, interval=0.05, what="the migration waiting for the table lock")
        traffic = psycopg2.connect(dsn)
        try:
            with traffic.cursor() as cur:
                # the blocker holds on: without a lock timeout this queues behind the ALTER for good
                cur.execute("SET statement_timeout = '30s'")
                cur.execute("SELECT count(*) FROM ops_counters")
        finally:
            traffic.close()
    finally:
        blocker.rollback()
        blocker.close()
        watcher.close()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-1500:]
    assert "lock" in out.lower(), out[-1500:]  # it said why it waited and tried again
    _assert_at_head(url)


def test_a_second_upgrade_waits_for_the_first_whatever_lock_timeout_the_server_sets(fresh_db, template_db, monkeypatch):
    """Managed PostgreSQL may set a lock_timeout on the database or role, as it sets a
    statement_timeout: the second of two concurrent upgrades then gave up its wait for the first's
    migrate lock after it — told as "a migration waited … for a table lock held by a long
    transaction", and retried only MIGRATE_LOCK_TRIES times however long the first one's
    migrations ran. The migrate lock is waited for as long as it takes (only a table lock behind
    live traffic is cut short)."""
    import threading

    import psycopg2
    from sqlalchemy.engine import make_url

    from app.db import engine as engine_mod

    url = fresh_db(template_db)
    dsn = url.replace("postgresql+psycopg2://", "postgresql://", 1)
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"ALTER DATABASE {make_url(url).database} SET lock_timeout = '100ms'")
        # the first upgrade, still running: it holds the migrate lock
        cur.execute("SELECT pg_advisory_lock(hashtextextended('memeflow.migrate', 0))")
    monkeypatch.setattr(engine_mod, "MIGRATE_LOCK_TRIES", 1)  # a cut wait is then the upgrade's failure
    failed: list[BaseException] = []

    def second() -> None:
        try:
            engine_mod.upgrade_to_head(url)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    runner = threading.Thread(target=second)
    runner.start()
    watcher = psycopg2.connect(dsn)
    watcher.autocommit = True  # pg_stat_activity is read once per transaction: a fresh one per look
    try:
        def waited_long_or_ended() -> bool:
            if not runner.is_alive():
                return True
            with watcher.cursor() as cur:  # ten times the server's lock_timeout, and still waiting
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                            " AND now() - state_change > interval '1 s' AND pid <> pg_backend_pid()")
                return cur.fetchone()[0] > 0

        poll_until(waited_long_or_ended, timeout=120, interval=0.05, what="the second upgrade waiting")
    finally:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock_all()")
        runner.join(120)
        admin.close()
        watcher.close()
    assert not runner.is_alive()
    assert failed == [], failed
