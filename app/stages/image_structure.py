"""Bounded walks over an image's structure, run before Pillow sees the bytes.

The pixel limit bounds the pixels; these bound the steps. A decoder's cost can lie in structure
that a few bytes repeat endlessly: a progressive JPEG's scans (each a pass over every block, in C),
and whatever Pillow walks in Python one step at a time — a JPEG's header junk, a GIF's frames,
sub-blocks and junk bytes (``n_frames`` walks every frame), a PNG's chunks (a call and a CRC each;
iCCP, zTXt and compressed iTXt inflated up to 1 MiB each). Each walk mirrors how its reader meets
the structure, costs one cheap step per element (a regex search or an index step), gives up at its
limit, and refuses what no encoder writes with PermanentError(code="invalid_image"). An animated
WebP's frames are counted by libwebp in C and an APNG's are declared (acTL): neither is walked, and
only the first frame is ever decoded (tests/unit/stages/test_decode_limits.py).
"""

from __future__ import annotations

import re

from app.stages.errors import PermanentError

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
# Pillow reads a JPEG's header (up to its first scan) in Python, one byte at a time through any
# junk or fill bytes between segments (0.15-0.3 µs each: 20 MiB of them held a thread 5 s), while
# a real file has none, or at most the rest of one segment whose length is off (< 64 KiB).
MAX_JPEG_HEADER_JUNK = 64 * 1024


def check_jpeg_structure(data: bytes) -> None:
    """Refuse a JPEG with more than ``MAX_JPEG_SCANS`` scans before its image ends (the first
    EOI; data after it, such as a motion photo's video, is never decoded), counted as libjpeg's
    marker reader meets them: segments skipped by their length, anything else up to the next
    marker; or with more than ``MAX_JPEG_HEADER_JUNK`` bytes of such junk before its first scan."""
    scans, junk, pos, end = 0, 0, 2, len(data)  # after the SOI
    for _ in range(MAX_JPEG_MARKERS):
        if scans:
            found = _JPEG_MARKER.search(data, pos)
        else:  # Pillow parses the header up to the first scan, byte by byte through any junk
            found = _JPEG_MARKER.search(data, pos, min(end, pos + MAX_JPEG_HEADER_JUNK - junk + 2))
            junk += (found.start() if found else end) - pos  # not found: junk (or nothing) to the end
            if junk > MAX_JPEG_HEADER_JUNK:
                raise PermanentError(f"a JPEG of more than {MAX_JPEG_HEADER_JUNK} bytes of junk between its "
                                     "header segments is not accepted", code="invalid_image")
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


# A GIF frame can be 15 bytes, so 20 MiB holds 1.4 million of them, and Pillow's ``n_frames`` walks
# each (~4 µs: 6 s). We decode the first frame only; a real animation holds hundreds (10,000 is over
# 5 minutes at 30 fps), and 10,000 costs Pillow ~40 ms.
MAX_GIF_FRAMES = 10_000
# Data sub-blocks (Pillow skips each in a Python step) plus junk bytes between blocks (Pillow reads
# them one at a time). Encoders write 255-byte sub-blocks: a 20 MiB GIF holds ~82,000.
MAX_GIF_BLOCKS = 250_000
_GIF_INTRODUCER = re.compile(rb"[!,;]")  # extension, image descriptor, trailer


def _invalid_gif(what: str) -> PermanentError:
    return PermanentError(f"a GIF of more than {what} is not accepted", code="invalid_image")


def check_gif_structure(data: bytes) -> None:
    """Refuse a GIF of more than ``MAX_GIF_FRAMES`` frames or ``MAX_GIF_BLOCKS`` sub-blocks and junk
    bytes before its trailer, walked as Pillow's reader walks it (GifImagePlugin ``_seek``): any byte
    that is not an introducer is skipped alone; an extension is a label and sub-blocks up to an empty
    one; an image a 9-byte descriptor, its palette, a code size and sub-blocks. Malformed files end
    the walk early: Pillow refuses them itself."""
    end = len(data)
    if end < 13:
        return
    pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # after the global palette
    frames = blocks = 0
    while pos < end:
        introducer = data[pos]
        if introducer == 0x3B:  # the trailer: Pillow stops here
            return
        if introducer == 0x21:  # an extension: a step of its own, even with no sub-blocks
            blocks += 1
            pos += 2
        elif introducer == 0x2C:
            frames += 1
            if frames > MAX_GIF_FRAMES:
                raise _invalid_gif(f"{MAX_GIF_FRAMES} frames")
            if pos + 10 >= end:
                return
            flags = data[pos + 9]
            pos += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1  # and the LZW code size
        else:
            found = _GIF_INTRODUCER.search(data, pos, pos + MAX_GIF_BLOCKS - blocks + 1)  # no further than allowed
            skipped = (found.start() if found else min(end, pos + MAX_GIF_BLOCKS - blocks + 1)) - pos
            blocks += skipped
            if blocks > MAX_GIF_BLOCKS:
                raise _invalid_gif(f"{MAX_GIF_BLOCKS} data blocks and junk bytes")
            pos += skipped
            continue
        while pos < end and data[pos]:  # sub-blocks: a length byte and that many bytes
            blocks += 1
            if blocks > MAX_GIF_BLOCKS:
                raise _invalid_gif(f"{MAX_GIF_BLOCKS} data blocks and junk bytes")
            pos += data[pos] + 1
        pos += 1  # the empty block that ends them


# Pillow reads every chunk to IEND, or in an APNG to the next frame's fcTL (a call, a CRC and, for an
# IDAT, a feed of the decoder each: ~3 µs; 20 MiB of empty chunks held a thread 6 s). Encoders split
# the pixels into 8-64 KiB IDATs: a 20 MiB file holds ~2,600.
MAX_PNG_CHUNKS = 20_000
# iCCP, zTXt and compressed iTXt chunks are each inflated up to 1 MiB (PngImagePlugin.MAX_TEXT_CHUNK)
# whatever their keyword, and a 1 KiB zlib bomb fills that: 20,000 of them held a thread 90 s. Real
# files carry a profile and a few text chunks (ImageMagick's "Raw profile type" ones: up to 5).
MAX_PNG_COMPRESSED_CHUNKS = 16
_PNG_CHUNK_TYPE = re.compile(rb"[A-Za-z]{4}")
_COMPRESSED_TEXT = frozenset({b"iCCP", b"zTXt"})
_PIXELS = frozenset({b"IDAT", b"fdAT"})


def check_png_structure(data: bytes) -> None:
    """Refuse a PNG of more than ``MAX_PNG_CHUNKS`` chunks or ``MAX_PNG_COMPRESSED_CHUNKS`` compressed
    metadata chunks among those Pillow reads: up to IEND or, in an APNG, up to the fcTL that follows
    the first image's data (PngImagePlugin ``load_end``; the later frames are never read, so an APNG
    of many frames passes). Each chunk is one step (its length and type: the payload is never
    copied); a malformed chunk ends the walk, as it ends Pillow's."""
    pos, end = 8, len(data)
    chunks = compressed = 0
    frames: int | None = None  # as PngImagePlugin's acTL handler keeps it: a second acTL voids it
    framed = animated = pixels = False
    while pos + 8 <= end:
        kind = data[pos + 4:pos + 8]
        if kind == b"IEND" or not _PNG_CHUNK_TYPE.fullmatch(kind) or (animated and kind == b"fcTL"):
            return
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise PermanentError(f"a PNG of more than {MAX_PNG_CHUNKS} chunks is not accepted", code="invalid_image")
        length = int.from_bytes(data[pos:pos + 4], "big")
        if kind in _COMPRESSED_TEXT or (kind == b"iTXt" and _itxt_is_compressed(data, pos + 8, length)):
            compressed += 1
            if compressed > MAX_PNG_COMPRESSED_CHUNKS:
                raise PermanentError(f"a PNG of more than {MAX_PNG_COMPRESSED_CHUNKS} compressed metadata "
                                     "chunks (iCCP, zTXt, iTXt) is not accepted", code="invalid_image")
        if not pixels:
            if kind == b"acTL" and length >= 8:
                declared = int.from_bytes(data[pos + 8:pos + 12], "big")
                frames = None if frames is not None else declared if 0 < declared <= 0x80000000 else None
            elif kind == b"fcTL":
                framed = True
            elif kind in _PIXELS:
                pixels = True
                # Pillow's is_animated: the declared frames, plus the IDAT when no fcTL came before
                # it (a default image). An fcTL it refused counts here as one it took: then fewer
                # files stop early than in Pillow, never more.
                animated = frames is not None and frames + (0 if framed else 1) > 1
        pos += 12 + length  # length, type, payload, CRC


def _itxt_is_compressed(data: bytes, start: int, length: int) -> bool:
    """Whether the iTXt chunk whose payload spans ``start`` + ``length`` sets its compression flag
    (the byte after its keyword's NUL)."""
    nul = data.find(b"\0", start, start + length)
    return 0 <= nul < start + length - 1 and data[nul + 1] != 0
