"""Small image generators shared by the stage tests (tiny images keep the suite fast)."""

from __future__ import annotations

import io
import random
import zlib

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


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk (length, type, payload, CRC)."""
    return (len(payload).to_bytes(4, "big") + kind + payload
            + (zlib.crc32(kind + payload) & 0xFFFFFFFF).to_bytes(4, "big"))


def png_with_chunks(chunks: bytes, size: int = 8) -> bytes:
    """A valid size x size PNG with ``chunks`` (whole chunks) right after its IHDR."""
    data = encode(Image.new("RGB", (size, size), (10, 20, 30)), "PNG")
    ihdr_end = 8 + 12 + 13
    return data[:ihdr_end] + chunks + data[ihdr_end:]


def zlib_bomb(size: int = 1 << 20) -> bytes:
    """``size`` zero bytes deflated: about a thousandth of that on the wire."""
    return zlib.compress(b"\x00" * size, 9)


_GIF_FRAME = b"," + (0).to_bytes(4, "little") + (1).to_bytes(2, "little") * 2 + b"\x00" + b"\x02\x02\x44\x01\x00"


def gif_of_frames(frames: int, *, before: bytes = b"", frame_data_blocks: int = 0) -> bytes:
    """A 1x1 GIF of ``frames`` 15-byte frames; ``before`` (junk: Pillow reads it one byte at a time)
    precedes the first one, and its second frame's pixels are ``frame_data_blocks`` one-byte sub-blocks."""
    head = b"GIF89a" + b"\x01\x00\x01\x00\x80\x00\x00" + b"\x00\x00\x00\xff\xff\xff"
    body = before + _GIF_FRAME
    if frame_data_blocks:
        body += _GIF_FRAME[:11] + b"\x02" + b"\x01\x00" * frame_data_blocks + b"\x00"
    return head + body + _GIF_FRAME * (frames - 1) + b";"


def webp_of_frames(frames: int, size: int = 16) -> bytes:
    """An animated WebP of ``frames`` frames, its second frame's ANMF chunk repeated (encoding
    thousands of frames takes Pillow seconds)."""
    data = encode(Image.new("RGB", (size, size), "red"), "WEBP", save_all=True, lossless=True,
                  append_images=[Image.new("RGB", (size, size), "blue")])
    pos, chunks = 12, []
    while pos < len(data):
        length = int.from_bytes(data[pos + 4:pos + 8], "little")
        chunks.append(data[pos:pos + 8 + length + (length & 1)])
        pos += 8 + length + (length & 1)
    assert [c[:4] for c in chunks][-2:] == [b"ANMF", b"ANMF"]
    body = b"WEBP" + b"".join(chunks) + chunks[-1] * (frames - 2)
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def apng_of_frames(frames: int, size: int = 16, *, declared: int | None = None) -> bytes:
    """An APNG of ``frames`` frames, its second frame (fcTL + fdAT) repeated with new sequence
    numbers; its acTL declares ``declared`` frames (default: ``frames``)."""
    data = encode(Image.new("RGB", (size, size), "red"), "PNG", save_all=True,
                  append_images=[Image.new("RGB", (size, size), "blue")])
    pos, chunks = 8, []
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        chunks.append((data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    kinds = [k for k, _ in chunks]
    fctl, fdat = chunks[kinds.index(b"fdAT") - 1][1], chunks[kinds.index(b"fdAT")][1]
    head = [png_chunk(k, (declared or frames).to_bytes(4, "big") + p[4:]) if k == b"acTL" else png_chunk(k, p)
            for k, p in chunks[:kinds.index(b"fdAT") - 1]]
    seq, tail = 1, []
    for _ in range(frames - 1):
        tail += [png_chunk(b"fcTL", seq.to_bytes(4, "big") + fctl[4:]),
                 png_chunk(b"fdAT", (seq + 1).to_bytes(4, "big") + fdat[4:])]
        seq += 2
    return data[:8] + b"".join(head) + b"".join(tail) + png_chunk(b"IEND", b"")
