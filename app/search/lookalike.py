"""Look-alike re-ranking: the visual index proposes, a pixel comparison of the originals decides.

The stored visual descriptor (perceptual-v1: a 32x32 DCT hash, an 8x8 layout, a colour
histogram) is coarse by design — small, fast, and robust to resizing and recompression — but
coarse enough that two different pictures on similar flat backgrounds can score closer to each
other than a re-encoded copy does to its original (measured: a 0.6x-1.25x resized, cropped,
JPEG-60 twin at rank 3 behind a different drawing on a background of the same pale colour).

So ``POST /search/visual`` takes the descriptor's nearest ``RERANK_DEPTH`` images and orders
them by :func:`lookalike_score`: the mean of the descriptor's cosine and the Pearson correlation
of colour thumbnails of the two images at 16x16 and 32x32 pixels (both images squashed to the
square, box-filtered, all three channels). A resize, a crop of a few percent and JPEG
artefacts move a 32x32 thumbnail by less than a pixel and barely change the correlation; a
different drawing, or the same drawing in another colour, changes it a lot. Images beyond the
depth keep the descriptor's order after the re-ranked ones.

Thumbnails are computed from the stored originals on first use and kept in a process-wide LRU
keyed by the image's sha256 (bytes never change under a sha256, so an entry is never stale).
Everything here is pure (no database, no files): the caller supplies the images.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

THUMB_SIZES = (16, 32)
RERANK_DEPTH = 20
_CACHE_ENTRIES = 8192  # 16x16 + 32x32 RGB uint8 = 3.8 kB each: ~31 MB at most

Thumbnails = tuple[np.ndarray, ...]


def thumbnails(image: Image.Image) -> Thumbnails:
    """The image's colour thumbnails (one per ``THUMB_SIZES``), box-filtered, as uint8 arrays."""
    rgb = image.convert("RGB")
    if hasattr(rgb, "reduce") and min(rgb.size) >= 4 * max(THUMB_SIZES):  # a cheaper first step
        factor = max(1, min(rgb.size) // (2 * max(THUMB_SIZES)))
        rgb = rgb.reduce(factor)
    return tuple(
        np.asarray(rgb.resize((n, n), Image.Resampling.BOX), dtype=np.uint8) for n in THUMB_SIZES
    )


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    x = a.astype(np.float64).ravel()
    y = b.astype(np.float64).ravel()
    x -= x.mean()
    y -= y.mean()
    den = float(np.linalg.norm(x) * np.linalg.norm(y))
    if den == 0.0:  # a flat thumbnail has no correlation: compare the colours themselves (0..1)
        return 1.0 - float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean()) / 255.0
    return float(x @ y) / den


def pixel_similarity(a: Thumbnails, b: Thumbnails) -> float:
    """Mean Pearson correlation of two images' thumbnails (-1..1; 1 = same picture)."""
    return sum(_pearson(x, y) for x, y in zip(a, b, strict=True)) / len(a)


def lookalike_score(descriptor_cosine: float, pixels: float) -> float:
    """The re-ranking key: the descriptor's cosine and the two thumbnail correlations, averaged
    with equal weight per comparison (the descriptor, 16 px, 32 px)."""
    k = len(THUMB_SIZES)
    return (descriptor_cosine + k * pixels) / (1 + k)


class ThumbnailCache:
    """A thread-safe LRU of thumbnails keyed by image sha256."""

    def __init__(self, entries: int = _CACHE_ENTRIES) -> None:
        self.entries = int(entries)
        self._data: OrderedDict[str, Thumbnails] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sha256: str) -> Thumbnails | None:
        with self._lock:
            value = self._data.get(sha256)
            if value is not None:
                self._data.move_to_end(sha256)
            return value

    def put(self, sha256: str, value: Thumbnails) -> None:
        with self._lock:
            self._data[sha256] = value
            self._data.move_to_end(sha256)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


CACHE = ThumbnailCache()


def cached_thumbnails(sha256: str, load: Callable[[], Image.Image | None],
                      cache: ThumbnailCache = CACHE) -> Thumbnails | None:
    """The thumbnails of the image with ``sha256``, from the cache or from ``load()`` (None when
    the image cannot be loaded: its hit then keeps the descriptor's score)."""
    found = cache.get(sha256)
    if found is not None:
        return found
    image = load()
    if image is None:
        return None
    value = thumbnails(image)
    cache.put(sha256, value)
    return value


def rerank(hits: Sequence[dict[str, Any]], query: Thumbnails,
           candidates: Mapping[str, Thumbnails | None], *, depth: int = RERANK_DEPTH) -> list[dict[str, Any]]:
    """``hits`` (descriptor order, each ``{"image": {"id", …}, "score"}``) with the first ``depth``
    ordered by :func:`lookalike_score`; each re-ranked hit gains ``pixels`` and ``lookalike``.
    ``candidates`` maps image ids to their thumbnails (None or missing: not comparable — the hit
    is scored by its descriptor cosine alone)."""
    head = [dict(h) for h in hits[:depth]]
    for hit in head:
        thumbs = candidates.get(str(hit["image"]["id"]))
        if thumbs is None:
            hit["lookalike"] = float(hit["score"])
            continue
        hit["pixels"] = round(pixel_similarity(query, thumbs), 6)
        hit["lookalike"] = round(lookalike_score(float(hit["score"]), hit["pixels"]), 6)
    head.sort(key=lambda h: (-h["lookalike"], -float(h["score"]), str(h["image"]["id"])))
    return head + [dict(h) for h in hits[depth:]]
