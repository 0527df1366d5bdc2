"""Embedded services: start, answer, stop, restart on the same data without loss, reuse on 2nd start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg2
import pytest
import redis

from app.embedded import EmbeddedServiceError, EmbeddedServices, _pid_alive
from tests.conftest import poll_until


def test_start_stop_restart_keeps_data_and_second_start_reuses():
    # not pytest's tmp_path: its parents are 0700 and the unprivileged postgres user must reach the dir
    tmp_path = Path(tempfile.mkdtemp(prefix="memeflow-embedded-"))
    svc = EmbeddedServices(tmp_path / "var", fast_unsafe=True)
    urls = svc.start()
    try:
        again = EmbeddedServices(tmp_path / "var").start()  # a second start while running
        assert again == urls
        pg_pid = svc.postgres_pid()
        conn = psycopg2.connect(urls.database_url.replace("+psycopg2", ""))
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE keep (v text); INSERT INTO keep VALUES ('kept')")
        conn.close()
        r = redis.Redis.from_url(urls.broker_url)
        r.set("k", "v")
        r.close()
        svc.stop()
        assert svc.urls() is None and svc.postgres_pid() is None and svc.redis_pid() is None
        urls2 = svc.start()
        assert svc.postgres_pid() not in (None, pg_pid)
        conn = psycopg2.connect(urls2.database_url.replace("+psycopg2", ""))
        with conn, conn.cursor() as cur:
            cur.execute("SELECT v FROM keep")
            assert cur.fetchall() == [("kept",)]
        conn.close()
        assert redis.Redis.from_url(urls2.broker_url).ping()
    finally:
        svc.stop()
    assert svc.urls() is None
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_redis_moves_off_a_remembered_port_that_something_else_took_since():
    tmp_path = Path(tempfile.mkdtemp(prefix="memeflow-redisport-"))
    svc = EmbeddedServices(tmp_path / "var")
    squatter = socket.socket()
    try:
        svc.start_redis()
        port = json.loads((tmp_path / "var/run/redis.json").read_text())["port"]
        svc.stop_redis()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))  # any program may get an ephemeral port once it is free
        squatter.listen()
        with pytest.raises(EmbeddedServiceError):  # a restart under running processes never moves it
            svc.start_redis()
        url = svc.start().broker_url  # a fresh start may: nothing runs on the old broker URL yet
        moved = json.loads((tmp_path / "var/run/redis.json").read_text())["port"]
        assert moved != port and url == f"redis://127.0.0.1:{moved}/0"
        assert redis.Redis.from_url(url).ping()
    finally:
        squatter.close()
        svc.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)


def _point_postmaster_pid_at(pidfile: Path, pid: int) -> None:
    """As after an unclean stop and a reboot: the file (and the socket's lock file) name ``pid``,
    now another process, and the old server's start time."""
    lines = pidfile.read_text().splitlines()
    lines[0], lines[2] = str(pid), str(int(lines[2]) - 3600)
    pidfile.write_text("\n".join(lines) + "\n")
    socket_lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"  # the socket's lock names the pid too
    if socket_lock.exists():
        lock = socket_lock.read_text().splitlines()
        lock[0] = str(pid)
        socket_lock.write_text("\n".join(lock) + "\n")


def test_a_stale_postmaster_pid_naming_another_process_neither_blocks_start_nor_gets_it_signalled():
    tmp_path = Path(tempfile.mkdtemp(prefix="memeflow-stalepg-"))
    svc = EmbeddedServices(tmp_path / "var", fast_unsafe=True)
    pidfile = tmp_path / "var/postgres/postmaster.pid"
    others: list[subprocess.Popen] = []
    try:
        svc.start()
        pid = svc.postgres_pid()
        os.kill(pid, signal.SIGKILL)  # unclean stop: postmaster.pid stays
        # its backends notice the postmaster's death and exit (the shared memory is free again)
        pg_dir = pidfile.parent.resolve()
        poll_until(lambda: not _pid_alive(pid) and not _processes_in(pg_dir), timeout=30, interval=0.1,
                   what="the killed postmaster and its backends to be gone")
        others.append(subprocess.Popen(["sleep", "600"]))  # whatever got the old pid
        _point_postmaster_pid_at(pidfile, others[-1].pid)
        assert svc.postgres_pid() is None and svc.status()["postgres"]["url"] is None

        urls = svc.start()  # starts PostgreSQL again
        conn = psycopg2.connect(urls.database_url.replace("+psycopg2", ""))
        conn.close()
        assert svc.postgres_pid() not in (None, pid, others[-1].pid)
        running = pidfile.read_text()

        # services-stop never signals the process a stale file names
        svc.stop()
        others.append(subprocess.Popen(["sleep", "600"]))
        pidfile.write_text(running)  # left behind by a server that is gone
        _point_postmaster_pid_at(pidfile, others[-1].pid)
        svc.stop()
        assert others[-1].poll() is None
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
        svc.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)


def _processes_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` (every PostgreSQL process runs in its data dir)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == directory:
                out.append(int(proc.name))
        except OSError:
            continue
    return out
