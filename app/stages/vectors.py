"""Is a provider's vector one pgvector stores and a cosine can compare? One check for every vector
memeflow sends to the database: an artifact a worker stores (app/worker/executor.checked_vector)
and a search's query vector (app/search/service.py, app/api/search.py) alike."""

from __future__ import annotations

from typing import Any

import numpy as np

#: The largest magnitude a pgvector element (a float4) holds; a larger finite float overflows it.
FLOAT4_MAX = 3.4028234663852886e38
#: The smallest normal float4: a squared norm below it is no norm pgvector can divide by.
FLOAT4_TINY = float(np.finfo(np.float32).tiny)

#: Why :func:`vector_problem` refused a vector.
NOT_STORABLE = "not_storable"
NOT_COMPARABLE = "not_comparable"


def _storable_element(x: float) -> bool:
    return abs(x) <= FLOAT4_MAX  # False for NaN and the infinities too


def _comparable(values: list[float]) -> bool:
    """pgvector's cosine distance sums the squares in float4: a vector whose squared norm is 0
    there (all zeros, or elements so small their squares vanish) or overflows it (elements past
    ~1.8e19) has distance NaN to anything, and an HNSW cosine index leaves it out."""
    as_float4 = np.asarray(values, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        norm2 = float(np.dot(as_float4, as_float4))
    return FLOAT4_TINY <= norm2 < float("inf")


def vector_problem(vector: Any, dims: int) -> tuple[list[float] | None, str | None]:
    """``(floats, None)`` for a usable vector of ``dims`` elements, else ``(None, reason)``:
    :data:`NOT_STORABLE` — not ``dims`` numbers, or NaN, infinite or beyond float4 (pgvector
    refuses it); :data:`NOT_COMPARABLE` — stored but no float4 norm (all zeros): every cosine with
    it is NaN."""
    values = None
    if not isinstance(vector, str | bytes):  # iterable, but never a vector
        try:
            values = [float(x) for x in vector]
        except (TypeError, ValueError, OverflowError):
            pass
    if values is None or len(values) != dims or not all(map(_storable_element, values)):
        return None, NOT_STORABLE
    if not _comparable(values):
        return None, NOT_COMPARABLE
    return values, None
