"""Several text models in ONE stored vector, so search can fuse or route models per query.

Math. Let the parts be models 1..k, each giving unit vectors: ``d_i`` for a document (its
``embed``), ``q_i`` for a query (its ``embed_query``), and ``c_i = d_i · q_i`` the cosine that
model alone would score. The stored document vector is

    D = [d_1, …, d_k] / sqrt(k)                     |D| = 1, dims = Σ dims_i

and a query with weights ``w_i >= 0`` (not all zero) is

    Q(w) = [w_1 q_1, …, w_k q_k] / sqrt(Σ w_i²)      |Q| = 1

so the cosine pgvector computes is

    cos(D, Q) = Σ w_i c_i / (sqrt(k) · sqrt(Σ w_i²))

— a weighted sum of the per-model cosines times a constant that depends only on the weights,
not on the document. Hence for one query the ranking is that of the weighted score fusion
``Σ w_i c_i``; equal weights give exactly the mean of the cosines (``Σ c_i / k``); weight 0 for
every part but ``j`` gives ``c_j / sqrt(k)``, i.e. model ``j``'s own ranking. One row per image
version serves all of these. Caveat: an HNSW index is built over the full vectors; a query that
zeroes some parts is still exact for an exact scan but the approximate graph walk may recall a
little less than a model-specific index would.

A *bank* part (one with a ``bank_for`` attribute, e.g. ``multilingual-e5-small-querybank``) is
stored like the others but always weighs 0 in a query: it is read back for the top candidates
only, by query-bank normalisation (app/search/qbnorm.py), never scored by pgvector.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.stages import cpu
from app.stages.base import TextEmbeddingProvider
from app.stages.errors import PermanentError


class ConcatenatedTextProvider:
    """Concatenates the unit vectors of ``parts`` (each scaled by 1/sqrt(k)); see the module docstring.

    ``parts`` are text providers (the registry builds them from a spec such as
    ``multilingual-e5-small+all-MiniLM-L6-v2``). A part is named by its config's ``model``;
    names must be distinct.
    """

    name = "concatenated"

    def __init__(self, parts: Sequence[TextEmbeddingProvider], **_: Any) -> None:
        if len(parts) < 2:
            raise ValueError("a concatenated text provider needs at least two parts")
        self.parts: tuple[TextEmbeddingProvider, ...] = tuple(parts)
        configs = [part.config() for part in self.parts]
        self.part_names: tuple[str, ...] = tuple(str(cfg["model"]) for cfg in configs)
        if len(set(self.part_names)) != len(self.part_names):
            raise ValueError(f"concatenated parts must be distinct models, got {self.part_names}")
        versions = {str(cfg.get("document_version", "1")) for cfg in configs}
        if len(versions) != 1:
            raise ValueError(f"concatenated parts render different document versions: {sorted(versions)}")
        self.document_version = versions.pop()
        self._slices: dict[str, slice] = {}
        offset = 0
        for part_name, cfg in zip(self.part_names, configs, strict=True):
            self._slices[part_name] = slice(offset, offset + int(cfg["dims"]))
            offset += int(cfg["dims"])
        self.dims = offset
        #: bank part name → the part it normalises (its ``bank_for``); a bank part is never scored
        self.banks: dict[str, str] = {
            part_name: str(part.bank_for) for part_name, part in zip(self.part_names, self.parts, strict=True)
            if getattr(part, "bank_for", None)
        }
        for bank, scored in self.banks.items():
            if scored not in self.part_names or scored in self.banks:
                raise ValueError(f"bank part {bank} normalises {scored}, which is not a scored part here")
        self.scored_parts: tuple[str, ...] = tuple(p for p in self.part_names if p not in self.banks)

    def slices(self) -> dict[str, slice]:
        """Where each part's (scaled) vector sits in the concatenation, by part name, in order."""
        return dict(self._slices)

    def config(self) -> dict[str, Any]:
        """The parts' own configs in order, the total dims and the scaling; part of the fingerprint."""
        return {
            "provider": self.name,
            "model": "+".join(self.part_names),
            "dims": self.dims,
            "document_version": self.document_version,
            "normalized": True,
            "part_scale": "1/sqrt(k)",
            "parts": [part.config() for part in self.parts],
        }

    def warm(self) -> None:
        """Warm every part that can be warmed (load its model, run it once)."""
        for part in self.parts:
            warm = getattr(part, "warm", None)
            if callable(warm):
                warm()

    def embed(self, documents: list[str]) -> list[list[float]]:
        """Unit vectors ``[d_1, …, d_k] / sqrt(k)``, each part embedding the batch once.

        Inside a :func:`app.stages.cpu.burst` of more than one core the parts run at once, one
        thread each (up to the burst's cores), every part's call unchanged: the same vectors."""
        if not documents:
            return []
        scale = 1.0 / math.sqrt(len(self.parts))
        calls = [functools.partial(part.embed, documents) for part in self.parts]
        blocks = [np.asarray(v, dtype=np.float64) * scale for v in cpu.run_concurrently(calls, cpu.burst_cores())]
        return np.hstack(blocks).tolist()

    def embed_query(
        self, queries: list[str], weights: Mapping[str, float] | None = None
    ) -> list[list[float]]:
        """Unit vectors ``[w_1 q_1, …, w_k q_k] / sqrt(Σ w_i²)``: weighted fusion of the parts' cosines.

        ``weights`` maps part names to weights >= 0 (a part left out gets 0; ``None`` = all scored
        parts equal, i.e. the mean of their cosines). A zero-weight part is not computed at all; a
        bank part always weighs 0.
        """
        w = self._weights(weights)
        if not queries:
            return []
        norm = math.sqrt(sum(x * x for x in w))
        blocks = []
        for part, weight, part_name in zip(self.parts, w, self.part_names, strict=True):
            width = self._slices[part_name].stop - self._slices[part_name].start
            if weight == 0:
                blocks.append(np.zeros((len(queries), width)))
            else:
                blocks.append(np.asarray(part.embed_query(queries), dtype=np.float64) * (weight / norm))
        return np.hstack(blocks).tolist()

    def _weights(self, weights: Mapping[str, float] | None) -> list[float]:
        if weights is None:
            return [0.0 if p in self.banks else 1.0 for p in self.part_names]
        unknown = set(weights) - set(self.part_names)
        if unknown:
            raise PermanentError(
                f"unknown part(s) {sorted(unknown)}; parts are {list(self.part_names)}",
                code="invalid_weights",
            )
        if any(float(weights[b]) != 0 for b in self.banks if b in weights):
            raise PermanentError(f"bank parts {sorted(self.banks)} are never scored; give them no weight",
                                 code="invalid_weights")
        values = [float(weights.get(part_name, 0.0)) for part_name in self.part_names]
        if any(not math.isfinite(v) or v < 0 for v in values) or not any(values):
            raise PermanentError(
                f"weights must be finite, >= 0 and not all zero, got {dict(weights)}",
                code="invalid_weights",
            )
        return values
