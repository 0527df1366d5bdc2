"""Local continuation of hints under real Celery workers (MEMEFLOW_WORKER_LOCAL_HINTS,
app/worker/run.py ``LocalHints``): a worker that consumes every lane handles the hints its own
completions return instead of publishing them; with the setting off it publishes them."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_jobs_terminal
from tests.integration.fakes import read_calls
from tests.integration.test_celery_runtime import assert_each_stage_once, counting, ingest_many, make_orch

pytestmark = pytest.mark.slow

RECORDING = {"MEMEFLOW_WORKER_PUBLISHER": "tests.integration.fakes:recording_celery_publisher",
             # every image of the test in one wake-up group per lane (agent and embedding groups of <= 7)
             "MEMEFLOW_AGENT_BATCH_SIZE": "8", "MEMEFLOW_AGENT_LANE_LIMIT": "16"}


def _published(call_log) -> list[str]:
    return sorted(lane for stage, lane in read_calls(call_log) if stage == "hint-published")


@pytest.mark.parametrize(("pool", "local_hints"), [("solo", "8"), ("threads", "8"), ("prefork", "8"), ("solo", "0")])
def test_a_worker_of_every_lane_runs_its_own_completions_hints_itself(
    cluster, engine, publisher, call_log, pool, local_hints
):
    counting(cluster)
    orch = make_orch(engine, cluster.settings)
    cluster.worker("visual", "agent", "embedding", pool=pool, concurrency=2,
                   MEMEFLOW_WORKER_LOCAL_HINTS=local_hints, **RECORDING)
    job_ids = ingest_many(orch, cluster.settings, publisher, range(6))

    assert wait_jobs_terminal(engine, job_ids, timeout=90) == {"succeeded": 6}
    assert_each_stage_once(call_log, 6)
    published = _published(call_log)
    if local_hints == "0":  # every completion's hint went through the broker
        assert {"agent", "embedding"} <= set(published), published
    else:  # each visual batch's agent group, then its embedding group, ran here: none was published
        assert not {"agent", "embedding"} & set(published), published


def test_a_lane_worker_publishes_the_next_lanes_hints(cluster, engine, publisher, call_log):
    counting(cluster)
    orch = make_orch(engine, cluster.settings)
    for lane in ("visual", "agent", "embedding"):
        cluster.worker(lane, MEMEFLOW_WORKER_LOCAL_HINTS="8", **RECORDING)
    job_ids = ingest_many(orch, cluster.settings, publisher, range(6))

    assert wait_jobs_terminal(engine, job_ids, timeout=90) == {"succeeded": 6}
    assert_each_stage_once(call_log, 6)
    assert {"agent", "embedding"} <= set(_published(call_log))  # no lane's hint stays with a worker of another lane
