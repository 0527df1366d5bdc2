"""Bundled sample memes, generated on demand with Pillow (no shipped image files, no licence questions).

Each sample is a small classic-style meme: a coloured background, a simple drawn subject (cat,
dog, rocket, server …) and big captions with a dark outline, in English (DejaVu Sans Bold) or
Chinese (WenQuanYi Micro Hei). A few near-duplicates (a resized / recompressed copy of another
sample) give visual search something to find. Output is deterministic: the same Pillow version
writes the same bytes on every run.
"""

from __future__ import annotations

from app.samples.catalog import NEAR_DUPLICATES, SAMPLES, Sample
from app.samples.fonts import FontNotFound, find_font
from app.samples.render import generate_samples, render_sample

__all__ = [
    "NEAR_DUPLICATES",
    "SAMPLES",
    "FontNotFound",
    "Sample",
    "find_font",
    "generate_samples",
    "render_sample",
]
