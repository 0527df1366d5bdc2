"""A context edit (PATCH) of an image processed with ``reverse_image_policy=auto`` re-ran the agent.

SPEC §4.7: a PATCH makes an auto revision whose visual and agent stages are reused and whose text
stage runs. With no active job, the edit's job was planned with the default policy ``forbid``;
the agent context's provenance says ``auto``, so the agent stage counted as invalid and the edit
of a mere display name started a new paid agent call, whose answer then replaced the context.
"""

from __future__ import annotations

from app.orchestrator import Orchestrator, RecordingPublisher
from tests.support.agents import CountingAgent, providers_with
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest


def test_a_display_name_edit_of_an_auto_policy_image_reuses_its_agent_context(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(orch.settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(72), reverse_image_policy="auto")
    pub.publish(res.hints)
    drive(orch, pub, providers, clock, rounds=3)
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded"
    assert agent.calls["describe"] == 1
    context = orch.get_image("local", res.image["id"])["context"]

    edited = orch.edit_context("local", res.image["id"], display_name="renamed")
    assert edited.job is not None and edited.job["id"] != res.job["id"]
    assert [s["status"] for s in edited.job["stages"]][:2] == ["reused", "reused"], edited.job
    pub.publish(edited.hints)
    drive(orch, pub, providers, clock, rounds=3)
    assert orch.get_job("local", edited.job["id"])["status"] == "succeeded"
    assert agent.calls["describe"] == 1  # no second paid call
    image = orch.get_image("local", res.image["id"])
    assert image["display_name"] == "renamed" and image["context"] == context
