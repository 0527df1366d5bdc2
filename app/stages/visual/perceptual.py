"""``perceptual-v1``: a deterministic near-duplicate descriptor built with Pillow + NumPy.

The vector concatenates four L2-normalised, weighted blocks, then normalises the whole:

* 63 DCT perceptual-hash bits (±1): sign of the 8x8 low-frequency DCT coefficients of a 32x32
  grey thumbnail against their median (the classic pHash, DC term dropped);
* the same 63 coefficients as real values, so distances degrade smoothly instead of by bit flips;
* an 8x8 grey thumbnail, mean-centred (coarse layout);
* a 4x4x4 RGB colour histogram of a 64x64 thumbnail, square-rooted (Hellinger form).

All blocks survive resizing, recompression, small crops and small rotations; none is learned.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image

from app.stages.base import l2_normalise
from app.stages.images import DecodedImage

PREPROCESS_VERSION = "gray32-dct8-gray8-rgbhist4-v1"
_WEIGHTS = {"hash": 0.45, "dct": 0.55, "gray": 0.45, "hist": 0.55}
_DIMS = 63 + 63 + 64 + 64


@lru_cache(maxsize=1)
def _dct_matrix(n: int = 32) -> np.ndarray:
    """Orthonormal DCT-II matrix, so coeffs = D @ X @ D.T."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    d[0, :] = np.sqrt(1.0 / n)
    return d


def perceptual_vector(image: Image.Image) -> np.ndarray:
    """The perceptual-v1 descriptor of an RGB image (unit length, float64)."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")  # convert() of an RGB image copies it
    grey = rgb.convert("L")  # once for both grey thumbnails (the same pixels either way)
    grey32 = np.asarray(grey.resize((32, 32), Image.Resampling.BOX, reducing_gap=3.0), dtype=np.float64)
    d = _dct_matrix(32)
    coeffs = (d @ grey32 @ d.T)[:8, :8].flatten()[1:]
    hash_bits = np.where(coeffs > np.median(coeffs), 1.0, -1.0)

    grey8 = np.asarray(grey.resize((8, 8), Image.Resampling.BOX), dtype=np.float64)
    grey8 = grey8.flatten() - grey8.mean()

    small = np.asarray(rgb.resize((64, 64), Image.Resampling.BOX), dtype=np.int64) // 64
    bins = (small[..., 0] * 16 + small[..., 1] * 4 + small[..., 2]).flatten()
    hist = np.sqrt(np.bincount(bins, minlength=64).astype(np.float64))

    blocks = {"hash": hash_bits, "dct": coeffs, "gray": grey8, "hist": hist}
    return l2_normalise(np.concatenate([_WEIGHTS[k] * l2_normalise(v) for k, v in blocks.items()]))


class PerceptualVisualProvider:
    """Default visual provider: DCT hash + layout + colour histogram (no model, no weights)."""

    name = "perceptual-v1"

    def __init__(self, **_options: Any) -> None:
        pass

    def config(self) -> dict[str, Any]:
        """Identity of the descriptor; part of the visual stage fingerprint."""
        return {
            "provider": self.name,
            "model": "perceptual-v1",
            "preprocess_version": PREPROCESS_VERSION,
            "dims": _DIMS,
        }

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        """One unit-length vector per image."""
        return [perceptual_vector(img.image).tolist() for img in images]
