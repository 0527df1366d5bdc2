"""The bundled sample memes: deterministic bytes, expected count, decodable images, real fonts."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from app.samples import (
    NEAR_DUPLICATES,
    SAMPLES,
    FontNotFound,
    find_font,
    generate_samples,
)
from app.samples import fonts as fonts_mod


def _digests(paths):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_generation_is_deterministic_and_complete(tmp_path):
    first = generate_samples(tmp_path / "a")
    second = generate_samples(tmp_path / "b")
    assert _digests(first) == _digests(second)
    assert len(first) == len(SAMPLES) + len(NEAR_DUPLICATES)
    assert len(SAMPLES) >= 30
    assert sum(1 for s in SAMPLES if s.script == "cjk") >= 6
    assert len(set(_digests(first).values())) == len(first), "every file is distinct"


def test_every_sample_decodes_with_expected_size(tmp_path):
    for path in generate_samples(tmp_path):
        with Image.open(path) as img:
            img.load()
            assert img.mode == "RGB"
            if path.suffix == ".png":
                assert img.size == (480, 360)
                assert img.format == "PNG"
            else:
                assert img.format == "JPEG"


def test_near_duplicates_look_alike_and_differ_in_bytes(tmp_path):
    paths = {p.name: p for p in generate_samples(tmp_path)}
    for dup, (source, _, _) in NEAR_DUPLICATES.items():
        a = np.asarray(Image.open(paths[dup]).convert("L").resize((32, 24)), dtype=float)
        b = np.asarray(Image.open(paths[f"{source}.png"]).convert("L").resize((32, 24)), dtype=float)
        diff = float(np.abs(a - b).mean())
        assert diff < 8, f"{dup} should look like {source} (mean abs diff {diff:.1f})"
        assert paths[dup].read_bytes() != paths[f"{source}.png"].read_bytes()


def test_captions_are_drawn_in_white_text(tmp_path):
    # the caption band contains the white fill of the glyphs on every image
    for path in generate_samples(tmp_path, limit=8):
        with Image.open(path) as img:
            band = np.asarray(img.convert("RGB").crop((0, 0, img.width, img.height // 6)))
            white = int((band == 255).all(axis=2).sum())
            assert white > 150, f"{path.name}: no caption drawn"


def test_limit_keeps_some_chinese_and_matching_duplicates(tmp_path):
    paths = generate_samples(tmp_path, limit=10)
    names = {p.name for p in paths}
    originals = [n for n in names if n.endswith(".png")]
    assert len(originals) == 10
    cjk = {s.filename for s in SAMPLES if s.script == "cjk"}
    assert names & cjk
    assert "build-passes-small.jpg" in names


def test_missing_font_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(fonts_mod._FONTS, "cjk", ("No Such Font Family", ("/nonexistent.ttc",), "fonts-xyz"))
    with pytest.raises(FontNotFound, match="fonts-xyz"):
        find_font("cjk")
    assert find_font("latin").is_file()
