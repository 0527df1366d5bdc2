"""A dedicated embedding worker with several threads (``MEMEFLOW_EMBEDDING_WORKER_THREADS``, or
sized from the cores on a big box: ``Settings.embedding_threads``) runs batches side by side, and
every document is still embedded exactly once."""

from __future__ import annotations

import pytest

from app.cli.processes import lane_pool
from tests.integration.conftest import wait_jobs_terminal
from tests.integration.fakes import read_calls
from tests.integration.test_celery_runtime import assert_each_stage_once, counting, ingest_many, make_orch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("threads", [2, 1])
def test_an_embedding_worker_of_two_threads_runs_two_batches_at_once(cluster, engine, publisher, call_log, threads):
    counting(cluster, text_provider="tests.integration.fakes:OverlapText", embedding_batch_size=1,
             embedding_worker_threads=threads)
    pool, concurrency = lane_pool(cluster.settings, ["embedding"])  # what `memeflow up` / `worker` run
    assert (pool, concurrency) == (("threads", 2) if threads == 2 else ("solo", 1))
    orch = make_orch(engine, cluster.settings)
    cluster.worker("visual")
    cluster.worker("agent")
    cluster.worker("embedding", pool=pool, concurrency=concurrency)
    job_ids = ingest_many(orch, cluster.settings, publisher, range(6))

    assert wait_jobs_terminal(engine, job_ids, timeout=120) == {"succeeded": 6}
    assert_each_stage_once(call_log, 6)
    overlap = [key for stage, key in read_calls(call_log) if stage == "text-overlap"]
    # two threads: the first two batches met inside the model call; solo: the first waited alone
    assert overlap == (["met", "met"] if threads == 2 else ["alone", "alone"]), overlap
