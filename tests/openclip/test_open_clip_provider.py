"""open_clip visual provider, run under .venv-openclip by tests/unit/stages/test_open_clip.py.

The model is a tiny randomly initialised ViT (a config registered here; nothing is downloaded):
its state_dict is saved to a checkpoint file and loaded back through the registry, i.e. through
the provider's real loading code (open_clip.create_model_and_transforms with a file path).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import uuid

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from app.config import Settings
from app.orchestrator import fingerprints
from app.orchestrator.types import Claim, StageConfigs
from app.stages import registry
from app.stages.base import VisualProvider, config_hash
from app.stages.errors import PermanentError
from app.stages.images import decode_image
from app.stages.providers import Providers
from app.stages.visual import openclip as openclip_module
from app.worker.executor import execute_visual
from tests.unit.stages.helpers import decoded, encode, random_scene

TINY = "memeflow-tiny-vit"
OTHER = "memeflow-tiny-vit-wide"
EMBED_DIM = 32
TINY_CFG = {
    "embed_dim": EMBED_DIM,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 512, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module", autouse=True)
def tiny_model_configs(tmp_path_factory):
    """Register the tiny architectures with open_clip (as a deployment would a custom config)."""
    folder = tmp_path_factory.mktemp("model_configs")
    wide = json.loads(json.dumps(TINY_CFG))
    wide["vision_cfg"]["width"] = 96
    (folder / f"{TINY}.json").write_text(json.dumps(TINY_CFG))
    (folder / f"{OTHER}.json").write_text(json.dumps(wide))
    open_clip.add_model_config(folder)
    return folder


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


def save_random_checkpoint(path, seed: int, model_name: str = TINY):
    """A randomly initialised model (fixed by ``seed``) saved as a plain state_dict."""
    torch.manual_seed(seed)
    model = open_clip.create_model(model_name, pretrained=None)
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-seed0.pt", seed=0)


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-seed1.pt", seed=1)


@pytest.fixture(scope="module")
def images():
    return [decoded(random_scene(seed, size=96)) for seed in range(5)]


def provider_for(path, **options):
    return registry.get_visual_provider("open_clip", checkpoint_path=str(path), model_name=TINY, **options)


def reference_vectors(checkpoint_path, images) -> np.ndarray:
    """The same embedding computed by hand: a fresh model of another seed, then the saved weights."""
    torch.manual_seed(12345)
    model, _, transform = open_clip.create_model_and_transforms(TINY)
    model.load_state_dict(torch.load(checkpoint_path, weights_only=True))
    model.eval()
    with torch.inference_mode():
        features = model.encode_image(torch.stack([transform(img.image) for img in images]))
    features = features.double().numpy()
    return features / np.linalg.norm(features, axis=1, keepdims=True)


def test_loads_the_checkpoint_offline_and_embeds_with_its_weights(checkpoint, other_checkpoint, images, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the open_clip provider tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    provider = provider_for(checkpoint)
    assert isinstance(provider, VisualProvider)
    vectors = np.array(provider.embed(images))

    assert vectors.shape == (len(images), EMBED_DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(vectors, reference_vectors(checkpoint, images), atol=1e-5)
    assert np.abs(vectors - reference_vectors(other_checkpoint, images)).max() > 0.1
    similarities = vectors @ vectors.T
    assert similarities[~np.eye(len(images), dtype=bool)].max() < 0.9999  # distinct images, distinct vectors


def test_config_names_architecture_weights_and_preprocessing(checkpoint):
    cfg = provider_for(checkpoint).config()
    sha = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert cfg == {
        "provider": "open_clip",
        "model": f"{TINY}@{sha[:16]}",
        "architecture": TINY,
        "checkpoint_sha256": sha,
        "preprocess_version": cfg["preprocess_version"],
        "dims": EMBED_DIM,
    }
    assert cfg["preprocess_version"].startswith("open_clip-64x64-shortest-bicubic-")


def test_same_image_gives_identical_vector(checkpoint, images):
    provider = provider_for(checkpoint)
    assert provider.embed([images[0]]) == provider.embed([images[0]])
    assert provider.embed(images[:3]) == provider.embed(images[:3])


def test_batched_and_single_embeddings_agree(checkpoint, images):
    batched = np.array(provider_for(checkpoint, batch_size=2).embed(images))  # chunks of 2, 2, 1
    whole = np.array(provider_for(checkpoint).embed(images))
    single = np.array([provider_for(checkpoint).embed([img])[0] for img in images])
    np.testing.assert_allclose(batched, single, atol=1e-6)
    np.testing.assert_allclose(whole, single, atol=1e-6)
    assert provider_for(checkpoint).embed([]) == []


def test_fingerprint_follows_the_weights_not_the_path(checkpoint, other_checkpoint, tmp_path):
    first = provider_for(checkpoint).config()
    other = provider_for(other_checkpoint).config()
    assert config_hash(first) != config_hash(other)
    assert first["model"] != other["model"]  # the visual stage validity key changes too
    assert first["preprocess_version"] == other["preprocess_version"] and first["dims"] == other["dims"]
    copy = shutil.copyfile(checkpoint, tmp_path / "renamed.pt")
    assert config_hash(provider_for(copy).config()) == config_hash(first)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"checkpoint_path": None, "model_name": TINY}, "MEMEFLOW_OPEN_CLIP_CHECKPOINT"),
        ({"checkpoint_path": "/no/such/checkpoint.pt", "model_name": TINY}, "checkpoint not found"),
        ({"checkpoint_path": "/tmp", "model_name": TINY}, "checkpoint not found"),
        ({"checkpoint_path": "CKPT", "model_name": "no-such-arch"}, "unknown open_clip model config"),
        ({"checkpoint_path": "CKPT", "model_name": "hf-hub:org/repo"}, "never from a hub"),
    ],
)
def test_misconfiguration_is_a_clear_value_error(checkpoint, options, message):
    if options["checkpoint_path"] == "CKPT":
        options = {**options, "checkpoint_path": str(checkpoint)}
    with pytest.raises(ValueError, match=message):
        registry.get_visual_provider("open_clip", **options)


def test_unreadable_checkpoint_is_a_clear_value_error(checkpoint, monkeypatch):
    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(openclip_module, "file_sha256", denied)  # root reads any file: fake the denial
    with pytest.raises(ValueError, match="checkpoint unreadable.*Permission denied"):
        provider_for(checkpoint)


def test_corrupt_or_mismatched_checkpoint_fails_permanently_at_load(tmp_path, images):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"definitely not a torch checkpoint")
    with pytest.raises(PermanentError) as err:
        provider_for(corrupt).embed(images[:1])
    assert err.value.code == "visual_model_load_failed"
    assert str(tmp_path) not in err.value.message  # shown to tenants: no server path

    wide = save_random_checkpoint(tmp_path / "wide.pt", seed=0, model_name=OTHER)
    with pytest.raises(PermanentError) as err:
        provider_for(wide).embed(images[:1])  # weights of another architecture under TINY's name
    assert err.value.code == "visual_model_load_failed"


def test_checkpoint_replaced_before_loading_is_never_labelled_with_the_old_hash(tmp_path, images):
    path = save_random_checkpoint(tmp_path / "swap.pt", seed=0)
    provider = provider_for(path)  # hashed now, loaded lazily on first embed
    save_random_checkpoint(tmp_path / "new.pt", seed=1).replace(path)
    with pytest.raises(PermanentError) as err:
        provider.embed(images[:1])
    assert err.value.code == "visual_checkpoint_changed"


def test_invalid_image_is_a_permanent_invalid_image_error(checkpoint):
    with pytest.raises(PermanentError) as err:
        decode_image(b"GIF89a but not really an image")  # the one shared decoder, as workers use it
    assert err.value.code == "invalid_image"
    with pytest.raises(PermanentError) as err:
        provider_for(checkpoint).embed([Image.new("RGB", (8, 8))])  # pixels that bypassed decode_image
    assert err.value.code == "invalid_image"


def test_settings_select_it_and_the_worker_embeds_with_it(checkpoint, other_checkpoint, tmp_path):
    env = {
        "MEMEFLOW_VAR_DIR": str(tmp_path / "var"),
        "MEMEFLOW_VISUAL_PROVIDER": "open_clip",
        "MEMEFLOW_OPEN_CLIP_CHECKPOINT": str(checkpoint),
        "MEMEFLOW_OPEN_CLIP_MODEL": TINY,
        "MEMEFLOW_AGENT_PROVIDER": "deterministic",
        "MEMEFLOW_TEXT_PROVIDER": "deterministic",
    }
    settings = Settings.from_env(env)
    visual_config = StageConfigs.from_settings(settings).visual  # what new jobs freeze
    assert visual_config == provider_for(checkpoint).config()

    data = encode(random_scene(7, size=80))
    key = f"{uuid.uuid4()}/{hashlib.sha256(data).hexdigest()}.png"
    (settings.storage_path / key).parent.mkdir(parents=True)
    (settings.storage_path / key).write_bytes(data)

    def claim(config) -> Claim:
        return Claim(
            task_id=uuid.uuid4(), scope_id="local", job_id=uuid.uuid4(), image_id=uuid.uuid4(),
            image_sha256=hashlib.sha256(data).hexdigest(), stage="visual", lane="visual", owner="w1",
            generation=1, attempt_count=1, max_attempts=3, storage_key=key,
            payload={"stage_config_hash": fingerprints.config_hash(config)},
        )  # fmt: skip

    artifact = execute_visual(settings, Providers(settings), claim(visual_config))
    assert (artifact.model, artifact.preprocess_version, artifact.dims) == (
        visual_config["model"],
        visual_config["preprocess_version"],
        EMBED_DIM,
    )
    assert artifact.vector == provider_for(checkpoint).embed([decode_image(data)])[0]

    planned_with_other_weights = provider_for(other_checkpoint).config()
    with pytest.raises(PermanentError) as err:
        execute_visual(settings, Providers(settings), claim(planned_with_other_weights))
    assert err.value.code == "provider_config_mismatch"
