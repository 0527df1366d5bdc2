"""Every accepted format's decode cost is bounded by what the pipeline uses: the first frame.

Pillow walks some structures in Python a step at a time — a GIF's frames, sub-blocks and junk
bytes (``n_frames`` walks every frame), a PNG's chunks (each one a call and a CRC; the compressed
metadata ones inflated up to 1 MiB each), the junk between a JPEG's header segments — so a small
upload of endless such steps held a thread for seconds (20 MiB: 1.4 M GIF frames ~6 s, 20,000
zlib-bomb iCCP chunks ~90 s). The decoder walks them first, bounded, and refuses what no encoder
writes. The assertions are on refusal codes and on Pillow's work (files opened, frames decoded),
never on time."""

from __future__ import annotations

import io
import warnings

import pytest
from PIL import GifImagePlugin, Image, PngImagePlugin, WebPImagePlugin

from app.stages import images
from app.stages.errors import PermanentError
from app.stages.images import check_image, decode_image

from .helpers import (
    apng_of_frames,
    encode,
    gif_of_frames,
    png_chunk,
    png_with_chunks,
    random_scene,
    webp_of_frames,
    zlib_bomb,
)


@pytest.fixture()
def pillow_work(monkeypatch):
    """Counts of Pillow's work: files opened, GIF/PNG/WebP frames read, PNG chunks inflated."""
    counts = {"opened": 0, "gif frames": 0, "png frames": 0, "webp frames": 0, "inflated": 0}

    def spy(owner, name, key):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)

    spy(Image, "open", "opened")
    spy(GifImagePlugin.GifImageFile, "_seek", "gif frames")
    spy(PngImagePlugin.PngImageFile, "_seek", "png frames")
    spy(WebPImagePlugin.WebPImageFile, "_get_next", "webp frames")
    spy(PngImagePlugin, "_safe_zlib_decompress", "inflated")
    return counts


def _jpeg_with_header_junk(junk: bytes) -> bytes:
    data = encode(random_scene(21, size=32), "JPEG")
    return data[:20] + junk + data[20:]  # after the JFIF APP0 segment: before the frame header


HOSTILE = {
    "gif of endless frames": lambda: gif_of_frames(20_001),
    "gif of junk before its frame": lambda: gif_of_frames(1, before=b"\x00" * 600_000),
    "gif of one-byte sub-blocks": lambda: gif_of_frames(2, frame_data_blocks=600_000),
    "png of endless chunks": lambda: png_with_chunks(png_chunk(b"prVt", b"") * 30_000),
    # empty IDATs after the pixels: the decoder is fed (and Pillow's reader called) once per chunk
    "png of endless idat chunks": lambda: png_with_chunks(b"")[:-12] + png_chunk(b"IDAT", b"") * 30_000
        + png_chunk(b"IEND", b""),
    "png of icc profile bombs": lambda: png_with_chunks(png_chunk(b"iCCP", b"icc\0\0" + zlib_bomb()) * 40),
    "png of keyless ztxt bombs": lambda: png_with_chunks(png_chunk(b"zTXt", b"\0\0" + zlib_bomb()) * 40),
    "png of itxt bombs after its pixels": lambda: png_with_chunks(b"")[:-12]
        + png_chunk(b"iTXt", b"k\0\1\0\0\0" + zlib_bomb()) * 40 + png_chunk(b"IEND", b""),
    # an acTL of one frame: not animated, so Pillow reads every later frame's chunks to IEND
    "png declaring one frame of many": lambda: apng_of_frames(15_000, size=1, declared=1),
    "jpeg of header junk": lambda: _jpeg_with_header_junk(b"\x00" * 300_000),
    "jpeg of header fill bytes": lambda: _jpeg_with_header_junk(b"\xff" * 300_000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_structure_is_invalid_before_pillow_opens_it(name, pillow_work):
    data = HOSTILE[name]()
    assert len(data) < 2_000_000  # small: the cost was in the walk, not in the bytes
    for check in (check_image, decode_image):
        with pytest.raises(PermanentError) as info:
            check(data)
        assert info.value.code == "invalid_image"
    assert pillow_work["opened"] == 0


def _gif_at_the_limits() -> bytes:
    return gif_of_frames(images.MAX_GIF_FRAMES - 1, frame_data_blocks=images.MAX_GIF_BLOCKS // 2)


FINE = {
    "gif at the frame and block limits": (_gif_at_the_limits, "image/gif"),
    "gif junk at the limit": (lambda: gif_of_frames(2, before=b"\x00" * (images.MAX_GIF_BLOCKS // 2)), "image/gif"),
    "png at the chunk limit": (lambda: png_with_chunks(png_chunk(b"prVt", b"") * (images.MAX_PNG_CHUNKS - 5)),
                               "image/png"),
    "png at the compressed-chunk limit": (lambda: png_with_chunks(
        png_chunk(b"iCCP", b"icc\0\0" + zlib_bomb(1000))
        + png_chunk(b"zTXt", b"Comment\0\0" + zlib_bomb(1000)) * (images.MAX_PNG_COMPRESSED_CHUNKS - 1)
        + png_chunk(b"iTXt", b"k\0\0\0\0\0" + b"x" * 1000) * 50),  # uncompressed: not counted
        "image/png"),
    "jpeg with junk at the limit": (lambda: _jpeg_with_header_junk(b"\x00" * images.MAX_JPEG_HEADER_JUNK),
                                    "image/jpeg"),
    "real gif of 300 frames": (lambda: encode(Image.new("RGB", (32, 32)), "GIF", save_all=True, append_images=[
        Image.new("RGB", (32, 32), (i % 256, 0, 255 - i % 256)) for i in range(299)]), "image/gif"),
}


@pytest.mark.parametrize("name", sorted(FINE))
def test_structures_within_the_limits_pass(name):
    make, media_type = FINE[name]
    data = make()
    img = decode_image(data)
    assert check_image(data) == (img.width, img.height, media_type)


@pytest.mark.parametrize("media_type,make,counter", [
    ("image/webp", webp_of_frames, "webp frames"), ("image/png", apng_of_frames, "png frames")])
def test_webp_and_apng_of_many_frames_decode_only_their_first(media_type, make, counter, pillow_work):
    """libwebp's demuxer counts an animated WebP's frames in C and an APNG declares its count
    (acTL): neither is walked, and only the first frame is decoded — so neither is refused (the
    APNG's chunks after its first frame, more than MAX_PNG_CHUNKS here, are never read)."""
    frames = images.MAX_PNG_CHUNKS  # twice as many chunks
    data = make(frames)
    img = decode_image(data)
    assert (img.animated, img.frame_count, img.width) == (True, frames, 16)
    assert check_image(data) == (16, 16, media_type)
    assert pillow_work[counter] <= 2 * 2  # frame 0 (open, seek(0)), twice: nothing further


def test_real_pngs_with_metadata_pass():
    exif = Image.Exif()
    exif[0x0112] = 6
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "x" * 5000, zip=True)
    info.add_itxt("XML:com.adobe.xmp", "<x/>" * 2000, zip=True)
    data = encode(random_scene(22, size=40).resize((40, 24)), "PNG", pnginfo=info, exif=exif.tobytes(),
                  icc_profile=b"\0" * 3000)
    img = decode_image(data)
    assert (img.width, img.height) == (24, 40)
    assert check_image(data) == (24, 40, "image/png")
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        assert im.info["Comment"] == "x" * 5000


def test_a_gif_frame_larger_than_its_screen_is_held_to_the_pixel_limit():
    """Pillow grows a GIF's size to its first frame's extent: the pixel limit sees the grown size."""
    data = bytearray(gif_of_frames(1))
    data[13 + 6 + 1 + 4:13 + 6 + 1 + 8] = (7000).to_bytes(2, "little") * 2  # the frame: 7000x7000
    for check in (check_image, decode_image):
        with pytest.raises(PermanentError) as info:
            check(bytes(data))
        assert info.value.code == "invalid_image" and "exceed" in info.value.message


def _exif_block(entries: list[tuple[int, int, int, bytes]], tail: bytes = b"") -> bytes:
    """A big-endian TIFF header and one IFD of (tag, type, count, 4-byte value or offset) entries."""
    ifd = len(entries).to_bytes(2, "big") + b"".join(
        tag.to_bytes(2, "big") + typ.to_bytes(2, "big") + count.to_bytes(4, "big") + value
        for tag, typ, count, value in entries) + b"\0\0\0\0"
    return b"MM\0*\0\0\0\x08" + ifd + tail


ODD_ORIENTATIONS = {
    "zero": [(0x0112, 3, 1, b"\0\0\0\0")],
    "nine": [(0x0112, 3, 1, b"\0\x09\0\0")],
    "65535": [(0x0112, 3, 1, b"\xff\xff\0\0")],
    "two values": [(0x0112, 3, 2, b"\0\x06\0\x06")],
    "a string": [(0x0112, 2, 4, b"six\0")],
    "a rational": [(0x0112, 5, 1, (26).to_bytes(4, "big"))],  # 6/1 at offset 26
}


@pytest.mark.parametrize("name", sorted(ODD_ORIENTATIONS))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_odd_exif_orientations_decode_as_they_are_checked(name, fmt):
    exif = _exif_block(ODD_ORIENTATIONS[name], tail=(6).to_bytes(4, "big") + (1).to_bytes(4, "big"))
    data = encode(random_scene(23, size=40).resize((40, 24)), fmt, exif=b"Exif\0\0" + exif)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "tag 274 had too many entries": Pillow takes the first
        img = decode_image(data)
        assert check_image(data) == (img.width, img.height, f"image/{fmt.lower()}")
    assert {img.width, img.height} == {40, 24}


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_exif_tags_claiming_more_than_their_block_cost_only_the_block(fmt, monkeypatch):
    """2,000 tags each claiming 4 MB of the block: Pillow skips what the block cannot hold (it
    bounds the tag data by the block's size), so the bytes it reads stay within a few blocks."""
    from PIL import ImageFile

    read = {"bytes": 0}
    real = ImageFile._safe_read

    def counted(fp, size):
        data = real(fp, size)
        read["bytes"] += len(data)
        return data
    monkeypatch.setattr(ImageFile, "_safe_read", counted)
    exif = _exif_block([(0x010E + k % 50, 7, 4_000_000, (0).to_bytes(4, "big")) for k in range(2000)],
                       tail=b"\0" * 4_100_000)
    data = encode(Image.new("RGB", (8, 8)), fmt, exif=b"Exif\0\0" + exif)
    read["bytes"] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns per skipped tag
        assert check_image(data) == (8, 8, f"image/{fmt.lower()}")
        assert decode_image(data).width == 8
    assert read["bytes"] < 4 * len(data)
