"""``deterministic`` text provider: hashed bag of words. For tests and benchmarks only."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from app.stages.base import l2_normalise

DIMS = 64
_WORD = re.compile(r"\w+", re.UNICODE)


def _bucket(token: str) -> tuple[int, float]:
    digest = hashlib.sha256(token.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % DIMS, 1.0 if digest[4] & 1 else -1.0


class DeterministicTextProvider:
    """Equal texts give equal vectors; shared words raise cosine similarity. No semantics."""

    name = "deterministic"

    def __init__(self, *, document_version: str = "1", **_: Any) -> None:
        self.document_version = str(document_version)

    def config(self) -> dict[str, Any]:
        """Identity of this fake model."""
        return {
            "provider": self.name,
            "model": "deterministic-text-v1",
            "dims": DIMS,
            "document_version": self.document_version,
        }

    def embed(self, documents: list[str]) -> list[list[float]]:
        """Signed feature hashing of lower-cased words, L2-normalised."""
        vectors = []
        for doc in documents:
            vec = np.zeros(DIMS)
            tokens = _WORD.findall(doc.lower()) or [""]  # empty text still gets a unit vector
            for token in tokens:
                index, sign = _bucket(token)
                vec[index] += sign
            if not vec.any():  # words that cancelled out exactly
                vec[_bucket(doc)[0]] = 1.0
            vectors.append(l2_normalise(vec).tolist())
        return vectors

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        """Same as :meth:`embed` (the fake model is symmetric)."""
        return self.embed(queries)
