"""The watchdog's limits (``MEMEFLOW_<LANE>_RUN_MAX_S``, app/worker/watchdog.py): read per lane, 0 =
no limit, negative refused; the openai-compatible agent's own deadline always comes first."""

from __future__ import annotations

import pytest

from app.config import RUN_MAX_GRACE_S, Settings, SettingsError


def test_each_lane_reads_its_own_limit_and_zero_means_none():
    s = Settings.from_env({"MEMEFLOW_VISUAL_RUN_MAX_S": "7", "MEMEFLOW_AGENT_RUN_MAX_S": "8",
                           "MEMEFLOW_EMBEDDING_RUN_MAX_S": "0"})
    assert (s.run_max_s("visual"), s.run_max_s("agent"), s.run_max_s("embedding")) == (7.0, 8.0, 0.0)
    assert s.run_max_s("webhooks") == 0.0  # not a stage lane: never watched


def test_the_defaults_are_on_and_far_above_a_real_call():
    s = Settings()
    assert min(s.run_max_s(lane) for lane in ("visual", "agent", "embedding")) >= 600


@pytest.mark.parametrize("name", ["MEMEFLOW_VISUAL_RUN_MAX_S", "MEMEFLOW_AGENT_RUN_MAX_S",
                                  "MEMEFLOW_EMBEDDING_RUN_MAX_S"])
def test_a_negative_limit_is_refused_by_name(name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: "-1"})


def test_the_paid_agents_own_deadline_ends_its_call_before_the_watchdog():
    s = Settings(agent_provider="openai-compatible", agent_deadline_s=1200, agent_run_max_s=60)
    assert s.run_max_s("agent") == 1200 + RUN_MAX_GRACE_S
    assert Settings(agent_provider="openai-compatible", agent_run_max_s=0).run_max_s("agent") == 0.0
    assert Settings(agent_provider="local-ocr", agent_run_max_s=60).run_max_s("agent") == 60.0
