"""``deterministic`` visual provider: a hash of the pixels. For tests and benchmarks only."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from app.stages.base import l2_normalise
from app.stages.images import DecodedImage

DIMS = 64


def hash_vector(seed: bytes, dims: int) -> np.ndarray:
    """A unit vector expanded deterministically from ``seed`` with sha256 in counter mode."""
    out = bytearray()
    counter = 0
    while len(out) < dims:
        out += hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    raw = np.frombuffer(bytes(out[:dims]), dtype=np.uint8).astype(np.float64)
    return l2_normalise(raw - 127.5)


class DeterministicVisualProvider:
    """Model-free: identical pixels give identical vectors; any change gives an unrelated one.

    Test/benchmark only — it knows nothing about visual similarity.
    """

    name = "deterministic"

    def __init__(self, **_options: Any) -> None:
        pass

    def config(self) -> dict[str, Any]:
        """Identity of this fake model."""
        return {
            "provider": self.name,
            "model": "deterministic-v1",
            "preprocess_version": "sha256-pixels-v1",
            "dims": DIMS,
        }

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        """One unit vector per image from sha256 of its size and RGB pixels."""
        vectors = []
        for img in images:
            seed = f"{img.width}x{img.height}:".encode() + img.image.tobytes()
            vectors.append(hash_vector(hashlib.sha256(seed).digest(), DIMS).tolist())
        return vectors
