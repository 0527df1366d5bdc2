"""A JPEG's scans are bounded: each is a pass over every block of the image, however few its bytes.

A flat progressive JPEG's AC scans are a few bytes each (end-of-band runs); repeated, libjpeg
decodes every copy (a warning at most), so a few hundred KB held an upload's thread, a worker and
a thumbnail request for tens of seconds (10,000 copies over 6000x6000: 43 s to validate). The count
follows libjpeg's marker reader: what it skips (garbage between segments) hides no scan, and what it
never reads (segment payloads, anything after the image's end) adds none."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from app.stages.errors import PermanentError
from app.stages.images import MAX_JPEG_MARKERS, MAX_JPEG_SCANS, check_image, decode_image

from .helpers import encode, jpeg_segments, jpeg_with_repeated_scans, random_scene

MANY = {
    "repeated scans": lambda: jpeg_with_repeated_scans(MAX_JPEG_SCANS),
    # libjpeg skips bytes that are not a marker ("extraneous bytes before marker") and goes on
    "repeated scans behind garbage": lambda: jpeg_with_repeated_scans(MAX_JPEG_SCANS, between=b"junk\xff\x00"),
    "repeated scans behind fill bytes": lambda: jpeg_with_repeated_scans(MAX_JPEG_SCANS, between=b"\xff\xff"),
    "marker flood": lambda: jpeg_with_repeated_scans(0)[:-2] + b"\xff\xfe\x00\x02" * MAX_JPEG_MARKERS + b"\xff\xd9",
}


@pytest.mark.parametrize("name", sorted(MANY))
def test_a_jpeg_of_too_many_scans_is_invalid_before_it_is_decoded(name):
    data = MANY[name]()
    for check in (check_image, decode_image):
        with pytest.raises(PermanentError) as info:
            check(data)
        assert info.value.code == "invalid_image"


def _with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """``data`` with one segment inserted right after its SOI."""
    return data[:2] + bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


def _progressive_colour() -> bytes:
    return encode(random_scene(11, size=96), "JPEG", progressive=True, quality=85)


FINE = {
    "the most scans allowed": lambda: jpeg_with_repeated_scans(MAX_JPEG_SCANS - 6, size=64),
    "progressive colour": _progressive_colour,
    # an EXIF thumbnail or an ICC profile may hold a scan's marker bytes: skipped by its length
    "segments full of scan markers": lambda: _with_segment(
        _with_segment(_progressive_colour(), 0xE1, b"Exif\x00\x00" + b"\xff\xda\x00\x0c" * 4000),
        0xE2, b"\xff\xda" * 30000),
    # a motion photo's video after the image's end is never decoded
    "scan markers after the end": lambda: _progressive_colour() + b"\xff\xda\x00\x08\x01\x01\x00\x00" * 5000,
    "restart markers": lambda: encode(random_scene(12, size=256), "JPEG", progressive=True, restart_marker_blocks=1),
}


@pytest.mark.parametrize("name", sorted(FINE))
def test_real_jpegs_pass(name):
    data = FINE[name]()
    img = decode_image(data)
    assert check_image(data) == (img.width, img.height, "image/jpeg")


def test_the_helper_makes_what_it_says():
    data = jpeg_with_repeated_scans(3, size=64)
    assert sum(1 for m, _ in jpeg_segments(data) if m == 0xDA) == 6 + 3  # libjpeg's grey script + 3
    assert Image.open(io.BytesIO(data)).info.get("progressive") == 1
