"""The agent lane limits in force across workers (app/orchestrator/lane_limits.py): pure parts."""

from __future__ import annotations

from app.orchestrator.lane_limits import AgentLimits, disagreement, given, in_force, most_conservative


def test_the_most_conservative_limit_is_the_smallest_positive_and_unlimited_only_if_all_say_so():
    assert most_conservative([8, 4, 0]) == 4
    assert most_conservative([0, 0]) == 0
    assert most_conservative([0, 64]) == 64


def test_each_limit_is_taken_separately_and_this_process_counts_too():
    assert in_force(AgentLimits(0, 0), [AgentLimits(4, 0), AgentLimits(8, 2)]) == AgentLimits(4, 2)
    assert in_force(AgentLimits(3, 0), []) == AgentLimits(3, 0)


def test_disagreement_and_what_was_given_without_host_names():
    agree = {"a": AgentLimits(4, 0), "b": AgentLimits(4, 0)}
    assert not disagreement(agree) and given(agree) == [{"lane": 4, "resource": 0, "workers": 2}]
    differ = {"a": AgentLimits(0, 0), "b": AgentLimits(4, 0), "c": AgentLimits(8, 0)}
    assert disagreement(differ)
    assert [g["lane"] for g in given(differ)] == [4, 8, 0]
