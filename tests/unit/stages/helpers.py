"""Small image generators shared by the stage tests (tiny images keep the suite fast)."""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw

from app.stages.images import DecodedImage, decode_image


def encode(image: Image.Image, fmt: str = "PNG", **params) -> bytes:
    """Encode ``image`` to bytes in ``fmt``."""
    buf = io.BytesIO()
    image.save(buf, format=fmt, **params)
    return buf.getvalue()


def decoded(image: Image.Image, fmt: str = "PNG", **params) -> DecodedImage:
    """Round-trip ``image`` through encode + decode_image, as a worker would see it."""
    return decode_image(encode(image, fmt, **params))


def random_scene(seed: int, size: int = 128) -> Image.Image:
    """A distinct synthetic picture: random background plus random shapes, fixed by ``seed``."""
    rng = random.Random(seed)

    def colour() -> tuple[int, int, int]:
        return (rng.randrange(256), rng.randrange(256), rng.randrange(256))

    img = Image.new("RGB", (size, size), colour())
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(size), rng.randrange(size)
        x1, y1 = x0 + rng.randrange(size // 8, size // 2), y0 + rng.randrange(size // 8, size // 2)
        shape = rng.choice(["rect", "ellipse", "line"])
        if shape == "rect":
            draw.rectangle([x0, y0, x1, y1], fill=colour())
        elif shape == "ellipse":
            draw.ellipse([x0, y0, x1, y1], fill=colour())
        else:
            draw.line([x0, y0, x1, y1], fill=colour(), width=rng.randrange(3, 10))
    return img


def jpeg_segments(data: bytes) -> list[tuple[int, bytes]]:
    """(marker, bytes) of a well-formed JPEG from its SOI to its EOI; a scan's bytes hold its
    header and its entropy-coded data."""
    segments, pos = [(0xD8, data[:2])], 2
    while pos < len(data):
        marker = data[pos + 1]
        if marker == 0xD9:
            segments.append((marker, data[pos:pos + 2]))
            return segments
        end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        if marker == 0xDA:  # the entropy-coded data runs to the next marker (not FF00, not RSTn)
            while data[end] != 0xFF or data[end + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 1
        segments.append((marker, data[pos:end]))
        pos = end
    return segments


def jpeg_with_repeated_scans(scans: int, size: int = 512, *, between: bytes = b"") -> bytes:
    """A valid progressive greyscale JPEG whose last, tiny AC scan (a flat image's AC scans hold
    only end-of-band runs) is repeated ``scans`` more times, ``between`` before each copy. libjpeg
    decodes every copy — a pass over every block of the image each — with a warning at most: a few
    bytes per pass over the whole image."""
    segments = jpeg_segments(encode(Image.new("L", (size, size), 128), "JPEG", progressive=True))
    tiny = min((s for m, s in segments if m == 0xDA), key=len)
    body = b"".join(s for m, s in segments if m != 0xD9)
    return body + (between + tiny) * scans + b"\xff\xd9"
