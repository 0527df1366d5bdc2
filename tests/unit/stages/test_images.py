"""Image decoding: good formats decode; every kind of bad input is PermanentError(invalid_image)."""

from __future__ import annotations

import struct
import zlib

import pytest
from PIL import Image

from app.stages.errors import PermanentError
from app.stages.images import EXTENSIONS, check_image, decode_image, sniff_media_type

from .helpers import encode, random_scene


def _png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` but carries one tiny IDAT (a cheap bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")],
)
def test_supported_formats_decode_to_rgb(fmt, media_type):
    data = encode(random_scene(1, size=40), fmt)
    assert sniff_media_type(data) == media_type
    assert media_type in EXTENSIONS
    img = decode_image(data)
    assert (img.width, img.height, img.image.mode) == (40, 40, "RGB")
    assert img.media_type == media_type
    assert img.animated is False and img.frame_count == 1


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    data = encode(Image.new("RGB", (40, 20), "red"), "JPEG", exif=exif.tobytes())
    img = decode_image(data)
    assert (img.width, img.height) == (20, 40)


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (16, 16), colour) for colour in ("red", "blue", "green")]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    img = decode_image(data)
    assert img.animated is True and img.frame_count == 3
    r, g, b = img.image.getpixel((8, 8))
    assert r > 200 and g < 50 and b < 50


def test_transparent_pixels_become_white():
    data = encode(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), "PNG")
    assert decode_image(data).image.getpixel((0, 0)) == (255, 255, 255)


def _truncated_png() -> bytes:
    data = encode(random_scene(2, size=64), "PNG")
    return data[: len(data) // 2]


def truncated_animated_gif() -> bytes:
    """Three frames, the last one cut short: the first frame decodes, counting the frames fails."""
    frames = [Image.new("RGB", (8, 8), (i * 40, 0, 0)) for i in range(3)]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:])[:-20]


BAD_INPUTS = {
    "zero_bytes": lambda: b"",
    "truncated_png": _truncated_png,
    "truncated_animated_gif": truncated_animated_gif,
    "bomb_30000x30000": lambda: _png_header_claiming(30000, 30000),
    "text_file": lambda: b"hello, this is not an image\n",
    "png_magic_then_garbage": lambda: b"\x89PNG\r\n\x1a\n" + b"garbage" * 10,
    "unsupported_bmp": lambda: encode(Image.new("RGB", (4, 4)), "BMP"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_invalid_image(name):
    with pytest.raises(PermanentError) as info:
        decode_image(BAD_INPUTS[name]())
    assert info.value.code == "invalid_image"
    assert info.value.message


def test_bomb_limit_is_checked_before_decoding():
    # 7000x7000 is below Pillow's own limit, so only our header check can reject it.
    with pytest.raises(PermanentError) as info:
        decode_image(_png_header_claiming(7000, 7000))
    assert info.value.code == "invalid_image"
    assert "exceed" in info.value.message


def test_max_pixels_is_configurable():
    data = encode(random_scene(3, size=32), "PNG")
    with pytest.raises(PermanentError):
        decode_image(data, max_pixels=32 * 32 - 1)
    assert decode_image(data, max_pixels=32 * 32).width == 32


def _truncated_jpeg() -> bytes:
    data = encode(random_scene(4, size=256), "JPEG")
    return data[: len(data) // 2]


def _rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(random_scene(5, size=48).resize((48, 30)), "JPEG", exif=exif.tobytes())


_GOOD_INPUTS = {
    "png": lambda: encode(random_scene(6, size=40), "PNG"),
    "jpeg_odd_size": lambda: encode(random_scene(7, size=64).resize((61, 37)), "JPEG"),
    "jpeg_exif_rotated": _rotated_jpeg,
    "gif_animated": lambda: encode(Image.new("RGB", (16, 12), "red"), "GIF", save_all=True,
                                   append_images=[Image.new("RGB", (16, 12), "blue")], duration=50),
    "webp": lambda: encode(random_scene(8, size=40), "WEBP"),
    "png_rgba": lambda: encode(Image.new("RGBA", (9, 7), (0, 0, 0, 0)), "PNG"),
}


@pytest.mark.parametrize("name", sorted(_GOOD_INPUTS))
def test_check_image_reports_what_decode_image_decodes(name):
    """The upload's validation without pixels gives the same size and media type as the full decode."""
    data = _GOOD_INPUTS[name]()
    img = decode_image(data)
    assert check_image(data) == (img.width, img.height, img.media_type)


@pytest.mark.parametrize("name", sorted([*BAD_INPUTS, "truncated_jpeg"]))
def test_check_image_rejects_what_decode_image_rejects(name):
    data = _truncated_jpeg() if name == "truncated_jpeg" else BAD_INPUTS[name]()
    for check in (decode_image, check_image):
        with pytest.raises(PermanentError) as info:
            check(data)
        assert info.value.code == "invalid_image"
    with pytest.raises(PermanentError):
        check_image(encode(random_scene(3, size=32), "PNG"), max_pixels=32 * 32 - 1)
