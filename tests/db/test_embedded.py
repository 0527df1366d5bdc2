"""Embedded services: start, answer, stop, restart on the same data without loss, reuse on 2nd start."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import psycopg2
import redis

from app.embedded import EmbeddedServices


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
        url = svc.start_redis()
        moved = json.loads((tmp_path / "var/run/redis.json").read_text())["port"]
        assert moved != port and url == f"redis://127.0.0.1:{moved}/0"
        assert redis.Redis.from_url(url).ping()
    finally:
        squatter.close()
        svc.stop_redis()
        shutil.rmtree(tmp_path, ignore_errors=True)
