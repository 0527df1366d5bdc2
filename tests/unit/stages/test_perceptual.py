"""perceptual-v1: transformed copies find their original; unrelated images are far."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.stages.visual.perceptual import PerceptualVisualProvider

from .helpers import decoded, random_scene

N_IMAGES = 20


def _resize_half(img: Image.Image) -> Image.Image:
    return img.resize((img.width // 2, img.height // 2), Image.Resampling.BILINEAR)


def _crop_5pct(img: Image.Image) -> Image.Image:
    dx, dy = int(img.width * 0.05), int(img.height * 0.05)
    return img.crop((dx, dy, img.width, img.height))


def _rotate(img: Image.Image) -> Image.Image:
    return img.rotate(3, resample=Image.Resampling.BICUBIC, fillcolor=(255, 255, 255))


TRANSFORMS = {
    "resize_50": (_resize_half, "PNG", {}),
    "jpeg_q60": (lambda img: img, "JPEG", {"quality": 60}),
    "crop_5pct": (_crop_5pct, "PNG", {}),
    "rotate_3deg": (_rotate, "PNG", {}),
}


@pytest.fixture(scope="module")
def provider() -> PerceptualVisualProvider:
    return PerceptualVisualProvider()


@pytest.fixture(scope="module")
def originals():
    return [random_scene(seed) for seed in range(N_IMAGES)]


@pytest.fixture(scope="module")
def original_vectors(provider, originals) -> np.ndarray:
    return np.array(provider.embed([decoded(img) for img in originals]))


def test_config_and_vector_shape(provider, original_vectors):
    cfg = provider.config()
    assert {"provider", "model", "preprocess_version", "dims"} <= cfg.keys()
    assert cfg["model"] == "perceptual-v1"
    assert original_vectors.shape == (N_IMAGES, cfg["dims"])
    np.testing.assert_allclose(np.linalg.norm(original_vectors, axis=1), 1.0, atol=1e-9)


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_transformed_copy_nearest_neighbour_is_its_original(
    provider, originals, original_vectors, transform
):
    func, fmt, params = TRANSFORMS[transform]
    copies = provider.embed([decoded(func(img), fmt, **params) for img in originals])
    similarities = np.array(copies) @ original_vectors.T
    nearest = similarities.argmax(axis=1)
    assert nearest.tolist() == list(range(N_IMAGES)), similarities.round(3)
    # And with a margin: the copy is clearly closer to its original than to any other image.
    own = np.diag(similarities)
    others = np.where(np.eye(N_IMAGES, dtype=bool), -np.inf, similarities).max(axis=1)
    assert (own - others).min() > 0.05


def test_unrelated_images_are_far(original_vectors):
    similarities = original_vectors @ original_vectors.T
    off_diagonal = similarities[~np.eye(N_IMAGES, dtype=bool)]
    assert off_diagonal.max() < 0.9
    assert off_diagonal.mean() < 0.6


def test_identical_input_gives_identical_vector(provider, originals):
    first = provider.embed([decoded(originals[0])])
    second = provider.embed([decoded(originals[0])])
    assert first == second


def _reference_vector(image: Image.Image) -> np.ndarray:
    """perceptual-v1 as first written (a fresh RGB copy, grey converted per thumbnail): the
    descriptor must stay bit-identical to it, or its fingerprint (preprocess_version) must change."""
    from app.stages.base import l2_normalise
    from app.stages.visual.perceptual import _WEIGHTS, _dct_matrix

    rgb = image.convert("RGB")
    grey32 = np.asarray(rgb.convert("L").resize((32, 32), Image.Resampling.BOX, reducing_gap=3.0), dtype=np.float64)
    d = _dct_matrix(32)
    coeffs = (d @ grey32 @ d.T)[:8, :8].flatten()[1:]
    hash_bits = np.where(coeffs > np.median(coeffs), 1.0, -1.0)
    grey8 = np.asarray(rgb.convert("L").resize((8, 8), Image.Resampling.BOX), dtype=np.float64)
    grey8 = grey8.flatten() - grey8.mean()
    small = np.asarray(rgb.resize((64, 64), Image.Resampling.BOX), dtype=np.int64) // 64
    bins = (small[..., 0] * 16 + small[..., 1] * 4 + small[..., 2]).flatten()
    hist = np.sqrt(np.bincount(bins, minlength=64).astype(np.float64))
    blocks = {"hash": hash_bits, "dct": coeffs, "gray": grey8, "hist": hist}
    return l2_normalise(np.concatenate([_WEIGHTS[k] * l2_normalise(v) for k, v in blocks.items()]))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_vector_is_bit_identical_to_the_reference(originals, mode):
    from app.stages.visual.perceptual import perceptual_vector

    for img in originals[:5]:
        src = img.convert(mode)
        before = src.tobytes()
        assert perceptual_vector(src).tobytes() == _reference_vector(src).tobytes()
        assert src.tobytes() == before  # the caller's image is not modified
