"""Image sniffing, decoding and validation: the one place where untrusted bytes become pixels."""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, ImageOps

from app.stages.errors import PermanentError

EXTENSIONS: dict[str, str] = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
}

# Pillow format names, so Image.open never tries a decoder other than the sniffed one.
_PIL_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}

DEFAULT_MAX_PIXELS = 40_000_000

# A progressive JPEG is decoded in scans, each one pass over every block of the image, and a scan
# can be a few bytes (end-of-band runs): a 700 KB file of 10,000 scans of a 6000x6000 image held a
# thread for 40 s — the pixel limit does not see it, and 20 MiB holds ~30x more. Encoders write
# about 10 (libjpeg's progressive script: 6 grey, 10 colour); libjpeg-turbo refuses untrusted files
# by the same count (djpeg -maxscans, TJPARAM_SCANLIMIT).
MAX_JPEG_SCANS = 100
# Markers the scan count walks through before giving up: a real file holds tens (a split ICC
# profile a few hundred), and the walk costs one Python step each.
MAX_JPEG_MARKERS = 10_000
# The next marker as libjpeg's reader finds it: a 0xFF (after any fill 0xFFs) and a byte that is
# neither a stuffed zero nor a marker without a length (RSTn, TEM); whatever lies between — a
# scan's entropy-coded data, garbage — is skipped, as libjpeg skips it (with a warning).
_JPEG_MARKER = re.compile(rb"\xff([^\x00\xff\x01\xd0-\xd7])")
_SOI, _EOI, _SOS = 0xD8, 0xD9, 0xDA


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


def _check_jpeg_scans(data: bytes) -> None:
    """Refuse a JPEG with more than ``MAX_JPEG_SCANS`` scans before its image ends (the first
    EOI; data after it, such as a motion photo's video, is never decoded), counted as libjpeg's
    marker reader meets them: segments skipped by their length, anything else up to the next marker."""
    scans, pos, end = 0, 2, len(data)  # after the SOI
    for _ in range(MAX_JPEG_MARKERS):
        found = _JPEG_MARKER.search(data, pos)
        if found is None or found.group(1)[0] in (_EOI, _SOI):  # the image ends (a second SOI: an error)
            return
        if found.group(1)[0] == _SOS:
            scans += 1
            if scans > MAX_JPEG_SCANS:
                raise PermanentError(f"a JPEG of more than {MAX_JPEG_SCANS} scans (progressive passes) "
                                     "is not accepted", code="invalid_image")
        pos = found.end()
        if pos + 2 > end:
            return
        pos += max(int.from_bytes(data[pos:pos + 2], "big"), 2)  # the length counts its own two bytes
    raise PermanentError(f"a JPEG of more than {MAX_JPEG_MARKERS} markers is not accepted", code="invalid_image")


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
    if media_type == "image/jpeg":
        _check_jpeg_scans(data)  # before any decoding: the scans, not the pixels, are the cost
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
    header, so a file cut short after its first frame fails here (inside ``_opened``: invalid_image)."""
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
