"""Sizing for local CPU-bound providers: cores, the agent lane's limit and batch by provider kind,
the lane workers' pools, and the thread settings that reach the providers."""

from __future__ import annotations

import os

import pytest

from app.cli.processes import LOCAL_AGENT_PREFETCH, lane_pool, lane_prefetch
from app.cli.stack import Stack
from app.config import LOCAL_AGENT_LANE_LIMIT, REMOTE_AGENT_LANE_LIMIT, Settings, SettingsError
from app.orchestrator.lanes import lane_batch_size
from app.stages.cpu import available_cores
from app.stages.providers import agent_options, text_options


def test_available_cores_is_within_the_machine():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


def test_a_local_agent_is_limited_by_cores_and_a_remote_one_keeps_its_lane_limit():
    local = Settings(agent_provider="local-ocr")
    remote = Settings(agent_provider="openai-compatible")
    assert (local.agent_slots, remote.agent_slots) == (LOCAL_AGENT_LANE_LIMIT, REMOTE_AGENT_LANE_LIMIT) == (64, 4)
    assert (local.agent_batch, remote.agent_batch) == (1, 2)
    assert (lane_batch_size(local, "agent"), lane_batch_size(remote, "agent")) == (1, 2)
    # explicit settings win, for either kind
    assert Settings(agent_provider="local-ocr", agent_lane_limit=2).agent_slots == 2
    assert Settings(agent_provider="openai-compatible", agent_lane_limit=0).agent_slots == 0
    assert lane_batch_size(Settings(agent_provider="local-ocr", agent_batch_size=8, agent_lane_limit=3), "agent") == 3
    assert Settings.from_env({"MEMEFLOW_AGENT_LANE_LIMIT": "7"}).agent_slots == 7


def test_lane_workers_pools(monkeypatch):
    monkeypatch.setattr("app.stages.cpu.available_cores", lambda: 2)
    local = Settings(agent_provider="local-ocr")
    assert lane_pool(local, ["agent"]) == ("threads", 2)
    assert lane_pool(Settings(agent_provider="openai-compatible"), ["agent"]) == ("solo", 1)
    for lane in ("visual", "embedding"):
        assert lane_pool(local, [lane]) == ("solo", 1)


@pytest.mark.parametrize(("cores", "local", "remote"), [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 2), (8, 2, 4),
                                                        (16, 4, 8), (64, 16, 32)])
def test_a_big_box_runs_the_embedding_lane_in_threads_sized_from_its_cores(monkeypatch, cores, local, remote):
    # one text thread must not cap a box whose agent lane runs one OCR call per core: with a local
    # agent the text models are about a fifth of an image's CPU (one thread per 4 cores), without
    # one the text lane is most of it (one per 2)
    monkeypatch.setattr("app.stages.cpu.available_cores", lambda: cores)
    for settings, want in ((Settings(agent_provider="local-ocr"), local),
                           (Settings(agent_provider="openai-compatible"), remote)):
        assert settings.embedding_threads(cores) == want
        assert lane_pool(settings, ["embedding"]) == (("threads", want) if want > 1 else ("solo", 1))
        # only a worker of the embedding lane alone: a shared worker keeps its own rules
        assert lane_pool(settings, ["visual", "embedding"]) == ("solo", 1)


def test_the_embedding_threads_setting_wins_and_is_validated(monkeypatch):
    monkeypatch.setattr("app.stages.cpu.available_cores", lambda: 2)
    three = Settings.from_env({"MEMEFLOW_EMBEDDING_WORKER_THREADS": "3"})
    assert three.embedding_threads(2) == three.embedding_threads(64) == 3
    assert lane_pool(three, ["embedding"]) == ("threads", 3)
    assert lane_pool(Settings(embedding_worker_threads=1), ["embedding"]) == ("solo", 1)
    with pytest.raises(SettingsError):
        Settings.from_env({"MEMEFLOW_EMBEDDING_WORKER_THREADS": "-1"})


def test_the_stack_runs_a_local_agent_in_threads_and_takes_explicit_pools(tmp_path, monkeypatch):
    monkeypatch.setattr("app.stages.cpu.available_cores", lambda: 2)
    settings = Settings(var_dir=tmp_path, agent_provider="local-ocr")

    def pools(stack):
        out = {}
        for child in stack._plan():
            if child.name in ("visual", "agent", "embedding"):
                cmd = child.cmd
                out[child.name] = (cmd[cmd.index("-P") + 1], cmd[cmd.index("-c") + 1])
        return out

    assert pools(Stack(settings)) == {"visual": ("solo", "1"), "agent": ("threads", "2"),
                                      "embedding": ("solo", "1")}
    monkeypatch.setattr("app.stages.cpu.available_cores", lambda: 8)  # a bigger box: the text lane too
    assert pools(Stack(settings)) == {"visual": ("solo", "1"), "agent": ("threads", "8"),
                                      "embedding": ("threads", "2")}
    assert set(pools(Stack(settings, worker_pool="prefork", worker_concurrency=3)).values()) == {("prefork", "3")}


def test_only_a_local_agents_threads_worker_prefetches_the_next_hint_of_each_thread(tmp_path):
    local, remote = Settings(agent_provider="local-ocr"), Settings(agent_provider="openai-compatible")
    assert lane_prefetch(local, ["agent"], "threads") == LOCAL_AGENT_PREFETCH == 2
    assert lane_prefetch(local, ["agent"], "prefork") == 1  # an explicit pool: celeryconfig's 1
    assert lane_prefetch(remote, ["agent"], "threads") == 1  # a paid agent reserves nothing ahead
    assert lane_prefetch(local, ["visual"], "solo") == lane_prefetch(local, ["embedding"], "solo") == 1

    def prefetch(stack):
        out = {}
        for child in stack._plan():
            if child.name in ("visual", "agent", "embedding"):
                cmd = child.cmd
                out[child.name] = cmd[cmd.index("--prefetch-multiplier") + 1] if "--prefetch-multiplier" in cmd else "1"
        return out

    settings = Settings(var_dir=tmp_path, agent_provider="local-ocr")
    assert prefetch(Stack(settings)) == {"visual": "1", "agent": "2", "embedding": "1"}
    assert set(prefetch(Stack(settings, worker_pool="prefork", worker_concurrency=3)).values()) == {"1"}


def test_thread_settings_reach_the_local_providers():
    s = Settings(local_threads=2, agent_provider="local-ocr")
    assert agent_options(s)["threads"] == 2 and text_options(s)["num_threads"] == 2
    assert "num_threads" not in text_options(Settings(local_threads=0))  # 0: the libraries' defaults
    assert "threads" not in agent_options(Settings(agent_provider="deterministic"))
    with pytest.raises(SettingsError):
        Settings.from_env({"MEMEFLOW_LOCAL_THREADS": "-1"})
    with pytest.raises(SettingsError):
        Settings.from_env({"MEMEFLOW_AGENT_BATCH_SIZE": "-2"})


def test_an_empty_optional_variable_means_the_default_in_force():
    """docker-compose passes `${MEMEFLOW_AGENT_LANE_LIMIT:-}` when the operator set nothing."""
    assert Settings.from_env({"MEMEFLOW_AGENT_LANE_LIMIT": "", "MEMEFLOW_AGENT_PROVIDER": "local-ocr"}).agent_slots == 64
    assert Settings.from_env({"MEMEFLOW_AGENT_LANE_LIMIT": "", "MEMEFLOW_AGENT_PROVIDER": "openai-compatible"}
                             ).agent_slots == 4


def test_a_threads_worker_warms_one_local_ocr_engine_per_thread(monkeypatch):
    """A local agent's worker runs N calls at once in threads: it warms N OCR engines at start,
    so none of its threads loads a model on its first task."""
    from types import SimpleNamespace

    from app.worker import run, runtime, tasks

    seen: list = []
    monkeypatch.setattr(tasks, "preload", lambda lanes, concurrency=None: seen.append((lanes, concurrency)))
    monkeypatch.setenv(tasks.PRELOAD_ENV, "agent")
    monkeypatch.setattr(run, "COMPUTE_THREADS", 1)
    pool = type("TaskPool", (), {"__module__": "celery.concurrency.thread"})
    tasks._preload_in_solo(sender=SimpleNamespace(pool_cls=pool, concurrency=3))
    assert run.COMPUTE_THREADS == 3  # its claims are never a run alone (run._ComputeGate)
    solo = type("TaskPool", (), {"__module__": "celery.concurrency.solo"})
    tasks._preload_in_solo(sender=SimpleNamespace(pool_cls=solo, concurrency=1))
    assert seen == [(["agent"], 3), (["agent"], None)]

    class Ocr:
        name = "local-ocr"

        def warm(self, concurrency=None):
            warmed.append(concurrency)

    class Text:
        def warm(self):
            warmed.append("text")

    warmed: list = []
    rt = object.__new__(runtime.WorkerRuntime)
    by_kind = {"agent": Ocr(), "text": Text()}
    rt.providers, rt.owner = SimpleNamespace(get=by_kind.__getitem__), "test"  # Providers.get(kind)
    rt.load_lane("agent", 3)
    rt.load_lane("agent")
    rt.load_lane("embedding", 3)  # a provider without a concurrency parameter is warmed as before
    assert warmed == [3, None, "text"]


@pytest.mark.parametrize(("threads", "connections"), [(None, 6), (1, 6), (2, 6), (16, 20)])
def test_a_workers_connection_pool_grows_with_its_threads(threads, connections):
    # every task thread and the heartbeat thread may hold one connection at once: a 16-thread
    # worker on a big box must not queue its claims for one of 6 (no connection is opened here)
    from app.worker.celery_app import celery_app
    from app.worker.runtime import WorkerRuntime

    runtime = WorkerRuntime(Settings(database_url="postgresql+psycopg://memeflow@127.0.0.1:1/none"), celery_app,
                            threads)
    try:
        assert runtime.engine.pool.size() + runtime.engine.pool._max_overflow == connections
    finally:
        runtime.close()
