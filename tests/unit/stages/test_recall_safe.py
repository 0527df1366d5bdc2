"""Which agents may run an interrupted call again (``app.stages.base.is_recall_safe``): the local
ones declare it; a paid remote one, and any plugin that does not declare it itself, may not."""

from __future__ import annotations

from app.stages.agent.deterministic import DeterministicAgent
from app.stages.agent.local_ocr import LocalOcrAgent
from app.stages.agent.openai_compatible import OpenAICompatibleAgent
from app.stages.base import is_recall_safe
from app.stages.registry import get_agent_provider


def test_local_agents_are_recall_safe_and_the_paid_one_is_not(tmp_path):
    assert is_recall_safe(LocalOcrAgent(results_dir=str(tmp_path)))
    assert is_recall_safe(DeterministicAgent(results_dir=str(tmp_path)))
    remote = get_agent_provider("openai-compatible", base_url="http://127.0.0.1:9/v1", model="m", api_key="k",
                                timeout_s=1.0)
    assert isinstance(remote, OpenAICompatibleAgent) and not is_recall_safe(remote)


class Plugin:
    """A plugin agent (``package.module:Class``) that says nothing about recall-safety."""


class PaidSubclass(DeterministicAgent):
    """A plugin built on a local agent that calls out: it does not inherit the declaration."""


class DeclaredSubclass(DeterministicAgent):
    recall_safe = True


class Truthy:
    recall_safe = "yes"  # only True itself counts


def test_a_plugin_is_recall_safe_only_when_its_own_class_or_instance_says_so(tmp_path):
    assert not is_recall_safe(Plugin())
    assert not is_recall_safe(PaidSubclass(results_dir=str(tmp_path)))
    assert is_recall_safe(DeclaredSubclass(results_dir=str(tmp_path)))
    assert not is_recall_safe(Truthy())
    instance = Plugin()
    instance.recall_safe = True  # configured per instance
    assert is_recall_safe(instance)
    local = DeterministicAgent(results_dir=str(tmp_path))
    local.recall_safe = False  # an instance may withdraw its class's declaration
    assert not is_recall_safe(local)
