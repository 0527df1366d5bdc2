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
