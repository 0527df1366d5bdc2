"""Cheap text models that differ from ``deterministic`` (another name, another space, other dims):
the "new model" of the model-change tests. Spec: ``tests.support.textmodels:DeterministicTextB``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from app.stages.base import l2_normalise

_WORD = re.compile(r"\w+", re.UNICODE)
SPEC_B = "tests.support.textmodels:DeterministicTextB"
SPEC_C = "tests.support.textmodels:DeterministicTextC"


class DeterministicTextB:
    """Salted bag of words in 48 dims: equal words still meet, in a space unlike ``deterministic``'s."""

    name = "deterministic-b"
    model = "deterministic-text-b"
    dims = 48
    salt = b"b"

    def __init__(self, *, document_version: str = "1", **_: Any) -> None:
        self.document_version = str(document_version)

    def config(self) -> dict[str, Any]:
        return {"provider": self.name, "model": self.model, "dims": self.dims,
                "document_version": self.document_version}

    def embed(self, documents: list[str]) -> list[list[float]]:
        out = []
        for doc in documents:
            vec = np.zeros(self.dims)
            for token in _WORD.findall(doc.lower()) or [""]:
                digest = hashlib.sha256(self.salt + token.encode("utf-8")).digest()
                vec[int.from_bytes(digest[:4], "big") % self.dims] += 1.0 if digest[4] & 1 else -1.0
            if not vec.any():
                vec[0] = 1.0
            out.append(l2_normalise(vec).tolist())
        return out

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        return self.embed(queries)


class DeterministicTextC(DeterministicTextB):
    """A third model (32 dims) for a configuration that changes again during a backfill."""

    name = "deterministic-c"
    model = "deterministic-text-c"
    dims = 32
    salt = b"c"


VISUAL_SPEC_B = "tests.support.textmodels:DeterministicVisualB"


class DeterministicVisualB:
    """A second cheap visual model (48 dims, another hash): the "new model" of the visual tests."""

    name = "deterministic-visual-b"

    def __init__(self, **_: Any) -> None:
        pass

    def config(self) -> dict[str, Any]:
        return {"provider": self.name, "model": "deterministic-visual-b", "preprocess_version": "sha256-pixels-b",
                "dims": 48}

    def embed(self, images: list) -> list[list[float]]:
        from app.stages.visual.deterministic import hash_vector

        out = []
        for img in images:
            seed = b"b" + f"{img.width}x{img.height}:".encode() + img.image.tobytes()
            out.append(hash_vector(hashlib.sha256(seed).digest(), 48).tolist())
        return out


SPEC_B_POISONED = "tests.support.textmodels:PoisonedTextB"


class PoisonedTextB(DeterministicTextB):
    """``DeterministicTextB`` that fails for good on any document containing "poison"."""

    def embed(self, documents: list[str]) -> list[list[float]]:
        from app.stages.errors import PermanentError

        if any("poison" in d for d in documents):
            if len(documents) == 1:
                raise PermanentError("this document poisons the model", code="poisoned")
            raise RuntimeError("a poisoned document in the batch")  # bisected by the executor
        return super().embed(documents)


# ----------------------------------------------------------------------------- a hub and its bank
# Spec ``tests.support.textmodels:HubScored+tests.support.textmodels:HubBank``: three images told
# apart by width (the deterministic agent's title "<w>x<h> png image"): 40 is a hub (every other
# document's bank query finds it nearest), 41 the target, 42 another. The fixed query vector scores
# the hub 0.805 and the target 0.800, so the hub ranks first by cosine and query-bank normalisation
# (app/search/qbnorm.py) puts the target first. Worked through in tests/api/test_search_qbnorm.py.
_WIDTH = re.compile(r"(\d+)x\d+")
HUB_SPEC = "tests.support.textmodels:HubScored+tests.support.textmodels:HubBank"
HUB_PASSAGES = {40: (1.0, 1.0, 1.0), 41: (0.0, 1.0, 0.0), 42: (0.0, 0.0, 1.0)}
HUB_BANK = {40: (1.0, 0.0, 0.0), 41: (1.0, 0.9, 0.2), 42: (1.0, 0.2, 0.9)}
HUB_QUERY = (-0.006, 0.8, 0.6)


def _by_width(documents: list[str], table: dict[int, tuple[float, ...]]) -> list[list[float]]:
    out = []
    for doc in documents:
        m = _WIDTH.search(doc)
        out.append(l2_normalise(np.asarray(table.get(int(m.group(1)) if m else 0, (0.1, 0.1, 0.1)))).tolist())
    return out


class HubScored:
    name = "hub-scored"
    dims = 3

    def __init__(self, *, document_version: str = "1", **_: Any) -> None:
        self.document_version = str(document_version)

    def config(self) -> dict[str, Any]:
        return {"provider": self.name, "model": self.name, "dims": self.dims,
                "document_version": self.document_version, "normalized": True}

    def embed(self, documents: list[str]) -> list[list[float]]:
        return _by_width(documents, HUB_PASSAGES)

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        return [l2_normalise(np.asarray(HUB_QUERY)).tolist() for _ in queries]


class HubBank(HubScored):
    name = "hub-bank"
    bank_for = "hub-scored"

    def embed(self, documents: list[str]) -> list[list[float]]:
        return _by_width(documents, HUB_BANK)
