"""The API's gunicorn threads against the settings that hold them: a live event stream (SSE or a
long-poll) keeps one gthread thread for up to MEMEFLOW_EVENT_STREAM_MAX_S, and a process admits up
to MEMEFLOW_EVENT_STREAMS_PER_PROCESS of them. With no more threads than that (compose's
API_THREADS=8 beside the default 8 streams), a few open library pages held every thread of a
process: /healthz timed out and nothing else was served. Refused before any socket is opened."""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
from gunicorn.config import Config


def _server(*args: str) -> SimpleNamespace:
    cfg = Config()
    parsed = cfg.parser().parse_args([*args, "app.api.wsgi:app"])
    for name, value in vars(parsed).items():
        if value is not None and name in cfg.settings:
            cfg.set(name, value)
    return SimpleNamespace(cfg=cfg, log=logging.getLogger("gunicorn-test"))


@pytest.fixture()
def conf(monkeypatch):
    monkeypatch.delenv("MEMEFLOW_EVENT_STREAMS_PER_PROCESS", raising=False)
    monkeypatch.delenv("MEMEFLOW_SEARCHES_PER_PROCESS", raising=False)
    from app.api import gunicorn_conf

    return importlib.reload(gunicorn_conf)


@pytest.mark.parametrize("threads", ["1", "4", "8", "12"])
def test_no_more_threads_than_event_streams_and_searches_per_process_is_refused_before_binding(conf, threads):
    """8 streams and 6 searches may hold 14 threads at once: 12 threads would leave none."""
    server = _server("-b", "127.0.0.1:0", "--threads", threads, "-k", "app.api.server.JsonErrorWorker")
    with pytest.raises(SystemExit):
        conf.on_starting(server)


def test_the_default_and_compose_default_threads_start(conf):
    conf.on_starting(_server("-b", "127.0.0.1:0", "--threads", "16", "-k", "app.api.server.JsonErrorWorker"))
    conf.on_starting(_server("-b", "127.0.0.1:0", "--threads", str(conf.threads), "-k", conf.worker_class))


def test_fewer_streams_and_searches_per_process_allow_fewer_threads(monkeypatch):
    monkeypatch.setenv("MEMEFLOW_EVENT_STREAMS_PER_PROCESS", "2")
    monkeypatch.setenv("MEMEFLOW_SEARCHES_PER_PROCESS", "1")
    from app.api import gunicorn_conf

    conf = importlib.reload(gunicorn_conf)
    try:
        conf.on_starting(_server("-b", "127.0.0.1:0", "--threads", "4", "-k", "app.api.server.JsonErrorWorker"))
    finally:
        monkeypatch.delenv("MEMEFLOW_EVENT_STREAMS_PER_PROCESS")
        monkeypatch.delenv("MEMEFLOW_SEARCHES_PER_PROCESS")
        importlib.reload(gunicorn_conf)
