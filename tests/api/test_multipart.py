"""``app.api.multipart``: the boundary search finds exactly what werkzeug's compiled patterns
find, and the decoder built on it gives werkzeug's events, for generated bodies and chunkings."""

from __future__ import annotations

import random
import re

import pytest
from werkzeug import formparser
from werkzeug.sansio import multipart as wz

from app.api import multipart as mp

ALPHABET = [b"-", b"\r", b"\n", b" ", b"\t", b"\x0b", b"\x0c", b"a", b"b", b"\x00", b"\xff"]


def werkzeug_patterns(boundary: bytes) -> tuple[re.Pattern, re.Pattern]:
    """The two patterns as werkzeug's decoder compiles them (read off a real instance)."""
    d = wz.MultipartDecoder(boundary)
    return d.preamble_re, d.boundary_re


def random_buffer(rng: random.Random, boundary: bytes) -> bytes:
    pieces = []
    for _ in range(rng.randrange(1, 14)):
        r = rng.random()
        if r < 0.35:
            pieces.append(b"--" + boundary)
        elif r < 0.45:
            pieces.append((b"--" + boundary)[: rng.randrange(1, len(boundary) + 2)])
        else:
            pieces.append(b"".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 5))))
    return b"".join(pieces)


@pytest.mark.parametrize("boundary", [b"b", b"--", b"a-b", b"xyz", b"WebKitFormBoundary7MA4YWxk", b"a.b+c"])
def test_search_matches_werkzeugs_patterns(boundary):
    rng = random.Random(hash(boundary) & 0xFFFF)
    preamble_re, boundary_re = werkzeug_patterns(boundary)
    ours = (mp.BoundaryPattern(boundary, line_break_optional=True),
            mp.BoundaryPattern(boundary, line_break_optional=False))
    checked = 0
    for _ in range(3000):
        buf = random_buffer(rng, boundary)
        for kind in (bytes, bytearray):
            data = kind(buf)
            for pos in {0, 1, 2, rng.randrange(0, len(buf) + 2)}:
                for theirs, mine in zip((preamble_re, boundary_re), ours, strict=True):
                    want, got = theirs.search(data, pos), mine.search(data, pos)
                    if want is None:
                        assert got is None, (buf, pos)
                    else:
                        checked += 1
                        assert got is not None, (buf, pos)
                        assert (got.start(), got.end(), bytes(got.group(1))) == \
                            (want.start(), want.end(), bytes(want.group(1))), (buf, pos)
    assert checked > 1000  # the generator does produce matches


def _events(decoder_cls, boundary: bytes, body: bytes, chunks: list[int]):
    decoder = decoder_cls(boundary, max_form_memory_size=10_000, max_parts=50)
    out, i = [], 0
    pieces = []
    for n in chunks:
        pieces.append(body[i:i + n])
        i += n
    pieces.append(body[i:])
    try:
        for piece in [*pieces, None]:
            decoder.receive_data(piece)
            while True:
                event = decoder.next_event()
                if isinstance(event, wz.NeedData):
                    break
                out.append(event)
                if isinstance(event, wz.Epilogue):
                    return out
    except Exception as exc:  # noqa: BLE001 - the same error is part of the same behaviour
        out.append((type(exc), str(exc)))
    return out


def random_body(rng: random.Random, boundary: bytes) -> bytes:
    lb = lambda: rng.choice([b"\r\n", b"\r\n", b"\n", b"\r"])  # noqa: E731
    parts = [b"preamble" if rng.random() < 0.3 else b""]
    for k in range(rng.randrange(0, 4)):
        name = f'form-data; name="f{k}"'.encode() + (b'; filename="x.bin"' if rng.random() < 0.5 else b"")
        payload = random_buffer(rng, boundary) if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(300))
        parts.append((lb() if k or parts[0] else b"") + b"--" + boundary + rng.choice([b"", b" ", b"\t "]) + lb()
                     + b"Content-Disposition: " + name + lb() + lb() + payload)
    parts.append(lb() + b"--" + boundary + b"--" + rng.choice([b"", b"\r\n", b" \n"]) + rng.choice([b"", b"epi"]))
    body = b"".join(parts)
    if rng.random() < 0.15:  # damaged: cut short
        body = body[: rng.randrange(0, len(body) + 1)]
    return body


def test_decoder_gives_werkzeugs_events():
    rng = random.Random(21)
    for _ in range(1500):
        boundary = rng.choice([b"b", b"-b-", b"boundary", b"a1"])
        body = random_body(rng, boundary)
        chunks = [rng.randrange(1, 40) for _ in range(rng.randrange(0, 6))]
        assert _events(mp.MultipartDecoder, boundary, body, chunks) == \
            _events(wz.MultipartDecoder, boundary, body, chunks), (boundary, body, chunks)


def test_the_api_installs_it(app):
    assert mp.install() is True
    assert formparser.MultipartDecoder is mp.MultipartDecoder
