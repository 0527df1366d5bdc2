"""A human context edit made after the job was cancelled, while its agent call was still running.

Cancelling a job whose agent task runs only asks the task to stop; the worker's paid call goes on
and its completion lands (the call is billed, so its answer is kept). Once the job has ended, no
active job's agent stage is in progress, so ``PATCH /images/{id}`` is allowed (SPEC §4.7: 409
only *while* an agent stage runs) and the human writes the context. The late agent completion
then wrote its own context over the human edit: the edit, its ``edited`` status and the text
embedding the edit's job made for it were silently lost.
"""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from app.worker.run import _outcome
from tests.support.agents import CountingAgent, providers_with, rows, step
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest


def test_a_late_agent_completion_of_a_cancelled_job_keeps_a_human_edit(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(orch.settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(71))
    image_id = res.image["id"]
    pub.publish(res.hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    claim = orch.claim_task(hint.task_id, "agent-worker", "agent")
    assert claim is not None
    artifact = _outcome(orch, claim, providers)  # the paid call, answered
    assert agent.calls["describe"] == 1

    orch.cancel_job("local", res.job["id"])  # running: cancel requested, the call goes on
    edited = orch.edit_context("local", image_id, context={"title": "written by a human"})
    pub.publish(edited.hints)
    orch.complete_task(claim, artifact)  # the worker's completion, after the edit

    image = orch.get_image("local", image_id)
    assert image["context"]["title"] == "written by a human"
    assert image["context_status"] == "edited"
    # the edit's job embeds the human's text and succeeds; no second paid call
    drive(orch, pub, providers, clock, rounds=3)
    job = orch.get_job("local", edited.job["id"])
    assert job["status"] == "succeeded", job
    image = orch.get_image("local", image_id)
    assert image["context"]["title"] == "written by a human"
    assert rows(engine, "SELECT count(*) FROM text_embeddings WHERE image_id = :i AND metadata_hash = :m",
                i=image_id, m=image["metadata_hash"]) == [(1,)]
    assert agent.calls["describe"] == 1
