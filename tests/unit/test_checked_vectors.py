"""A provider's vector that pgvector would refuse fails its own item, in every embedding path of
the executor: the lane's model and the extra models a scope's model change needs (SPEC §10).

No database: the executor's batch functions with stand-in providers and orchestrator reads; that
the refused vector would have aborted the batch's completion is tests/db/test_batch_isolation.py's.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from app.orchestrator.types import Claim, TextArtifact, VisualArtifact
from app.stages.errors import PermanentError, RetryableError
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.visual.deterministic import DeterministicVisualProvider
from app.worker.executor import checked_vector, execute_text_batch, execute_visual_batch
from tests.support.pipeline import png_bytes

BAD_VECTORS = {
    "nan": [0.5, float("nan"), 0.5],
    "infinity": [0.5, float("inf"), 0.5],
    "minus infinity": [float("-inf"), 0.5, 0.5],
    "past float4": [0.5, -1e39, 0.5],
    "too short": [0.5, 0.5],
    "too long": [0.5] * 4,
    "not numbers": [0.5, "x", 0.5],
    "a string": "0.5",
    "none": None,
    "nested": [[0.5], [0.5], [0.5]],
    # stored, but pgvector's cosine (squares summed in float4) is NaN against it
    "all zeros": [0.0, 0.0, -0.0],
    "squares vanish in float4": [1e-25, 1e-25, 0.0],
    "squares overflow float4": [0.5, -3.4e38, 0.5],
}


@pytest.mark.parametrize("kind", list(BAD_VECTORS))
def test_a_vector_pgvector_refuses_is_that_items_provider_bad_output(kind):
    err = checked_vector(BAD_VECTORS[kind], 3)
    assert isinstance(err, PermanentError) and err.code == "provider_bad_output"


def test_a_good_vector_comes_back_as_floats_and_an_items_own_error_as_is():
    assert checked_vector((1, 0.5, -1e18), 3) == [1.0, 0.5, -1e18]
    assert checked_vector((1e-18, 0, 0), 3) == [1e-18, 0.0, 0.0]
    assert all(type(x) is float for x in checked_vector([1, 2, 3], 3))
    own = RetryableError("busy", code="provider_busy")
    assert checked_vector(own, 3) is own


class NaNFor:
    """Wraps a provider: the item ``poisoned(item)`` says is poisoned gets a NaN vector."""

    def __init__(self, provider, poisoned):
        self.provider, self.poisoned = provider, poisoned

    def config(self):
        return self.provider.config()

    def embed(self, items):
        vectors = self.provider.embed(items)
        return [[float("nan")] * len(v) if self.poisoned(x) else v for x, v in zip(items, vectors, strict=True)]


class OtherText(DeterministicTextProvider):
    """A second text model (as a scope's target model in a model change)."""

    def config(self):
        return {**super().config(), "model": "other-text-v1"}


class OtherVisual(DeterministicVisualProvider):
    def config(self):
        return {**super().config(), "model": "other-visual-v1"}


def _claims(n: int, lane: str, stage: str) -> list[Claim]:
    return [Claim(task_id=uuid.uuid4(), scope_id="local", job_id=uuid.uuid4(), image_id=uuid.uuid4(),
                  image_sha256=f"{i:064x}", stage=stage, lane=lane, owner="w", generation=1, attempt_count=1,
                  max_attempts=3, payload={}, storage_key=f"local/{i}.png") for i in range(n)]


def test_a_nan_vector_of_an_extra_text_model_fails_only_its_claim():
    claims = _claims(3, "embedding", "text_embedding")
    other = NaNFor(OtherText(), lambda doc: "POISON" in doc)
    ref = {"model": "other-text-v1", "dims": other.config()["dims"], "spec": "other", "options": {}}
    inputs = {c.image_id: {"display_name": f"{'POISON ' if i == 1 else ''}meme {i}", "context": None,
                           "metadata_hash": "h", "scope_id": "local", "extra_models": [ref]}
              for i, c in enumerate(claims)}
    orch = SimpleNamespace(text_inputs_many=lambda _claims: inputs)
    providers = SimpleNamespace(text=DeterministicTextProvider(), text_for=lambda _ref: other)
    out = execute_text_batch(orch, None, providers, claims)
    assert isinstance(out[1], PermanentError) and out[1].code == "provider_bad_output"
    for good in (out[0], out[2]):
        assert isinstance(good, TextArtifact) and [e.model for e in good.extra] == ["other-text-v1"]


def test_a_nan_vector_of_an_extra_visual_model_fails_only_its_claim(tmp_path):
    import dataclasses
    import hashlib

    claims = []
    for i, claim in enumerate(_claims(3, "visual", "visual")):
        data = png_bytes(i, (61 if i == 2 else 48, 40))
        sha = hashlib.sha256(data).hexdigest()  # a stored file is read only if its bytes are its key's
        claim = dataclasses.replace(claim, image_sha256=sha, storage_key=f"{uuid.UUID(int=7)}/{sha}.png")
        (tmp_path / claim.storage_key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / claim.storage_key).write_bytes(data)
        claims.append(claim)
    other = NaNFor(OtherVisual(), lambda image: image.width == 61)
    ref = {"model": "other-visual-v1", "dims": other.config()["dims"],
           "preprocess_version": other.config()["preprocess_version"], "spec": "other", "options": {}}
    orch = SimpleNamespace(visual_extra_models=lambda cs: {c.image_id: [ref] for c in cs})
    providers = SimpleNamespace(visual=DeterministicVisualProvider(), visual_for=lambda _ref: other)
    settings = SimpleNamespace(storage_path=tmp_path, max_image_pixels=10**6)
    out = execute_visual_batch(settings, providers, claims, orch)
    assert isinstance(out[2], PermanentError) and out[2].code == "provider_bad_output"
    for good in out[:2]:
        assert isinstance(good, VisualArtifact) and [e.model for e in good.extra] == ["other-visual-v1"]


def test_a_nan_vector_of_the_lanes_own_model_fails_only_its_claim():
    claims = _claims(2, "embedding", "text_embedding")
    inputs = {c.image_id: {"display_name": f"{'POISON ' if i == 0 else ''}meme", "context": None,
                           "metadata_hash": "h", "scope_id": "local", "extra_models": []}
              for i, c in enumerate(claims)}
    providers = SimpleNamespace(text=NaNFor(DeterministicTextProvider(), lambda doc: "POISON" in doc))
    out = execute_text_batch(SimpleNamespace(text_inputs_many=lambda _c: inputs), None, providers, claims)
    assert isinstance(out[0], PermanentError) and out[0].code == "provider_bad_output"
    assert isinstance(out[1], TextArtifact)
