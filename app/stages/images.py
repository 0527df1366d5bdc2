"""Image sniffing, decoding and validation: the one place where untrusted bytes become pixels."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, ImageOps

from app.stages.errors import PermanentError
from app.stages.image_structure import (
    MAX_GIF_BLOCKS,
    MAX_GIF_FRAMES,
    MAX_JPEG_HEADER_JUNK,
    MAX_JPEG_MARKERS,
    MAX_JPEG_SCANS,
    MAX_PNG_CHUNKS,
    MAX_PNG_COMPRESSED_CHUNKS,
    check_gif_structure,
    check_jpeg_structure,
    check_png_structure,
)

__all__ = [  # the limits are re-exported: callers and tests know the decoder, not its walks
    "MAX_GIF_BLOCKS", "MAX_GIF_FRAMES", "MAX_JPEG_HEADER_JUNK", "MAX_JPEG_MARKERS", "MAX_JPEG_SCANS",
    "MAX_PNG_CHUNKS", "MAX_PNG_COMPRESSED_CHUNKS", "DEFAULT_MAX_PIXELS", "DecodedImage", "EXTENSIONS", "check_image",
    "decode_image", "sniff_media_type",
]

EXTENSIONS: dict[str, str] = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
}

# Pillow format names, so Image.open never tries a decoder other than the sniffed one.
_PIL_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}

DEFAULT_MAX_PIXELS = 40_000_000


@dataclass(frozen=True)
class DecodedImage:
    """A fully decoded RGB image (EXIF orientation applied; first frame when animated)."""

    image: Image.Image
    width: int
    height: int
    media_type: str
    animated: bool
    frame_count: int


def sniff_media_type(data: bytes) -> str | None:
    """Return the media type named by the magic bytes, or None if it is not a supported image."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _no_check(data: bytes) -> None:
    """WebP: libwebp's demuxer walks the chunks in C, and only the first frame is decoded."""


_STRUCTURE_CHECKS = {
    "image/jpeg": check_jpeg_structure,
    "image/gif": check_gif_structure,
    "image/png": check_png_structure,
}


@contextmanager
def _opened(data: bytes, max_pixels: int) -> Iterator[tuple[Image.Image, str]]:
    """The checks :func:`decode_image` and :func:`check_image` share: the bytes are a supported
    image whose header dimensions are within ``max_pixels`` (checked before any pixel is decoded,
    so a decompression bomb costs only the header parse); yields (the open image, its media type).
    Any failure inside, the caller's decoding included, is PermanentError(code="invalid_image")."""
    if not data:
        raise PermanentError("image is empty (zero bytes)", code="invalid_image")
    media_type = sniff_media_type(data)
    if media_type is None:
        raise PermanentError("not a supported image (png, jpeg, gif, webp)", code="invalid_image")
    # before Pillow sees the bytes: the structure it walks, not the pixels, is the cost
    _STRUCTURE_CHECKS.get(media_type, _no_check)(data)
    try:
        with warnings.catch_warnings():
            # Pillow warns (rather than raises) between 1x and 2x its own limit; make it fatal.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[media_type]]) as im:
                width, height = im.size
                if width <= 0 or height <= 0 or width * height > max_pixels:
                    raise PermanentError(
                        f"image dimensions {width}x{height} exceed the limit "
                        f"of {max_pixels} pixels",
                        code="invalid_image",
                    )
                yield im, media_type
    except PermanentError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise PermanentError(f"image too large: {exc}", code="invalid_image") from exc
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, EOFError, ...
        raise PermanentError(f"cannot decode image: {exc}", code="invalid_image") from exc


def _frames(im: Image.Image) -> tuple[bool, int]:
    """(animated, frame count) of an open image. Counting a GIF's frames walks every frame's
    header, so a file cut short after its first frame fails here (inside ``_opened``: invalid_image);
    ``check_gif_structure`` bounded that walk before the file was opened."""
    return bool(getattr(im, "is_animated", False)), int(getattr(im, "n_frames", 1))


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> DecodedImage:
    """Decode and fully load ``data``; raise PermanentError(code="invalid_image") on any bad input
    (the checks of :func:`_opened`)."""
    with _opened(data, max_pixels) as (im, media_type):
        animated, frame_count = _frames(im)
        im.seek(0)
        im.load()
        # exif_transpose returns a new image (transposed, or a copy): _to_rgb need not copy it again
        rgb = _to_rgb(ImageOps.exif_transpose(im), copy=False)
    return DecodedImage(
        image=rgb,
        width=rgb.width,
        height=rgb.height,
        media_type=media_type,
        animated=animated,
        frame_count=frame_count,
    )


_ORIENTATION = 0x0112
_SWAPS_AXES = {5, 6, 7, 8}  # EXIF orientations that rotate by 90° (transposed, exif_transpose swaps w/h)


def check_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int, str]:
    """Validate ``data`` exactly as :func:`decode_image` does and return (width, height, media type)
    as it would — orientation applied — without building the RGB image.

    Every byte of the first frame is still decoded (a truncated or corrupt file fails here), but
    a JPEG is decoded at 1/8 scale (``draft``: libjpeg reads the whole entropy-coded stream and
    skips most of the inverse DCT), and nothing is converted, transposed or copied. The API's
    upload needs no pixels, only the proof that they decode: measured, a 1920×1080 JPEG photo
    costs a fraction of the full decode (docs/performance-log.md §12)."""
    with _opened(data, max_pixels) as (im, media_type):
        width, height = im.size
        orientation = im.getexif().get(_ORIENTATION)
        _frames(im)  # as decode_image counts them: a GIF whose later frames are cut short fails both
        im.seek(0)
        if media_type == "image/jpeg":
            im.draft(im.mode, ((width + 7) // 8, (height + 7) // 8))
        im.load()
    if orientation in _SWAPS_AXES:
        width, height = height, width
    return width, height, media_type


def _to_rgb(im: Image.Image, *, copy: bool = True) -> Image.Image:
    """Flatten to RGB; transparent pixels become white (memes are read on light backgrounds).
    ``copy=False``: an RGB image that is already the caller's own comes back as is."""
    if im.mode == "RGB":
        return im.copy() if copy else im
    has_alpha = im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)
    if not has_alpha:
        return im.convert("RGB")
    rgba = im.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")
