"""Registry resolution and caching; deterministic providers; config_hash; error types."""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest
from PIL import Image

from app.stages import registry
from app.stages.base import (
    AgentProvider,
    TextEmbeddingProvider,
    VisualProvider,
    config_hash,
)
from app.stages.errors import (
    OutcomeUnknownError,
    PermanentError,
    RetryableError,
    StageError,
)

from . import fakes
from .helpers import decoded, random_scene


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


def test_builtin_names_resolve_to_their_interfaces(tmp_path):
    visual = registry.get_visual_provider("perceptual-v1")
    agent = registry.get_agent_provider("local-ocr", results_dir=str(tmp_path))
    remote = registry.get_agent_provider(
        "openai-compatible", base_url="http://127.0.0.1:9/v1", model="m", api_key="k"
    )
    text = registry.get_text_provider("deterministic")
    assert isinstance(visual, VisualProvider) and visual.config()["model"] == "perceptual-v1"
    assert isinstance(agent, AgentProvider) and agent.config()["provider"] == "local-ocr"
    assert isinstance(remote, AgentProvider) and remote.config()["provider"] == "openai-compatible"
    assert isinstance(text, TextEmbeddingProvider)
    assert "api_key" not in remote.config()  # secrets never enter fingerprints


def test_instance_is_cached_per_name_and_options():
    a = registry.get_visual_provider("tests.unit.stages.fakes:CountingVisualProvider", size=1)
    b = registry.get_visual_provider("tests.unit.stages.fakes:CountingVisualProvider", size=1)
    c = registry.get_visual_provider("tests.unit.stages.fakes:CountingVisualProvider", size=2)
    assert a is b and a is not c
    assert c.options == {"size": 2}
    a.embed([])
    assert b.calls == 1


def test_custom_class_by_module_path():
    provider = registry.get_visual_provider(f"{fakes.__name__}:CountingVisualProvider")
    assert provider.config()["model"] == "counting-v1"


def test_text_provider_by_local_directory(tmp_path):
    provider = registry.get_text_provider(
        str(tmp_path)
    )  # loads lazily, so an empty dir is fine here
    assert provider.model_path == tmp_path


@pytest.mark.parametrize(
    ("getter", "name"),
    [
        (registry.get_visual_provider, "nope"),
        (registry.get_agent_provider, "gpt-magic"),
        (registry.get_text_provider, "/no/such/dir"),
        (registry.get_visual_provider, "no.such.module:Thing"),
    ],
)
def test_unknown_name_is_a_clear_value_error(getter, name):
    with pytest.raises(ValueError, match="provider"):
        getter(name)


def test_local_agents_require_results_dir():
    with pytest.raises(TypeError):
        registry.get_agent_provider("deterministic")


def test_deterministic_visual_is_stable_and_normalised():
    provider = registry.get_visual_provider("deterministic")
    images = [decoded(random_scene(1, 32)), decoded(random_scene(2, 32))]
    first, second = provider.embed(images), provider.embed(images)
    assert first == second and len(first[0]) == provider.config()["dims"] == 64
    assert first[0] != first[1]
    assert np.linalg.norm(first[0]) == pytest.approx(1.0)
    assert provider.config()["model"] == "deterministic-v1"


def test_deterministic_agent_records_and_looks_up(tmp_path):
    agent = registry.get_agent_provider("deterministic", results_dir=str(tmp_path))
    attempt_id = str(uuid.uuid4())
    image = decoded(Image.new("RGB", (30, 20), "blue"))
    result = agent.describe(image, attempt_id=attempt_id, reverse_image_policy="forbid")
    assert set(result.context) == {"title", "description", "ocr_text", "tags", "facts"}
    assert result.context["facts"]["dominant_colors"] == ["#0000ff"]
    assert agent.lookup(attempt_id).result == result
    assert agent.lookup(str(uuid.uuid4())).status == "not_received"
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind


def test_deterministic_text_similarity():
    provider = registry.get_text_provider("deterministic")
    a, b, c, d = np.array(
        provider.embed(["funny cat meme", "funny cat meme", "funny cat picture", "stock crash"])
    )
    assert provider.config()["model"] == "deterministic-text-v1" and a.shape == (64,)
    assert a @ b == pytest.approx(1.0)
    assert a @ c > a @ d
    assert np.linalg.norm(provider.embed([""])[0]) == pytest.approx(1.0)


def test_config_hash_is_canonical():
    assert config_hash({"b": 1, "a": "é"}) == config_hash({"a": "é", "b": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    import hashlib

    assert (
        config_hash({"b": [1, 2], "a": "é"})
        == hashlib.sha256('{"a":"é","b":[1,2]}'.encode()).hexdigest()
    )


def test_errors_carry_stable_codes_and_survive_pickling():
    err = RetryableError("x", code="agent_rate_limited", not_executed=True, retry_after_s=3)
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.message, back.not_executed, back.retry_after_s) == (
        "agent_rate_limited",
        "x",
        True,
        3,
    )
    assert OutcomeUnknownError().code == "agent_outcome_unknown"
    assert isinstance(PermanentError("m", code="invalid_image"), StageError)
    assert not issubclass(OutcomeUnknownError, RetryableError)


def test_a_slow_build_does_not_hold_up_lookups_of_other_providers():
    """The registry built every provider under one process-wide lock: while a search that needs a
    model not loaded yet (the serving model during a model change) waited for its weights, every
    other search of the API process — needing a provider long built — waited too."""
    import threading

    built = registry.get_text_provider("deterministic")
    slow = fakes.SlowToBuildTextProvider
    slow.entered.clear()
    slow.release.clear()
    loading = threading.Thread(target=registry.get_text_provider, args=("tests.unit.stages.fakes:SlowToBuildTextProvider",))
    loading.start()
    try:
        assert slow.entered.wait(30)
        got: list = []
        other = threading.Thread(target=lambda: got.append((registry.get_text_provider("deterministic"),
                                                            registry.get_visual_provider("deterministic"))))
        other.start()
        other.join(timeout=30)
        assert got and got[0][0] is built  # answered while the slow build still runs
    finally:
        slow.release.set()
        loading.join(timeout=30)
