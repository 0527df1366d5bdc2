"""werkzeug's multipart decoder without its two regex compilations per request.

``werkzeug.sansio.multipart.MultipartDecoder`` compiles two regular expressions that embed the
request's boundary (the preamble's end and a part's end). Clients pick a fresh random boundary per
request, so Python's regex cache never hits: ≈ 0.3 ms of API CPU per upload for the two compiles,
plus ≈ 0.2 ms to run the part-end pattern over the whole 60 KiB file (docs/performance-log.md §33).

:class:`BoundaryPattern` finds exactly what each of those patterns finds — the leftmost match,
the same span and the same group 1 — with ``bytes.find`` for the ``--boundary`` marker, a check
of the line break before it and one boundary-free precompiled pattern for what follows it (the
pattern's tail, verbatim). Everything else is werkzeug's own decoder and parser (limits, headers,
states, partial boundaries). :func:`install` swaps the decoder werkzeug's form parser builds,
once per process, and only after the two decoders agreed on a sample body — a werkzeug whose
decoder no longer works this way keeps its own. ``tests/api/test_multipart.py`` compares the two
on generated bodies, chunkings and near-boundaries.
"""

from __future__ import annotations

import re
import threading

from werkzeug import formparser
from werkzeug.sansio import multipart as _wz

_LINE_BREAK = rb"(?:\r\n|\n|\r)"
# werkzeug's patterns are  LB?--BOUNDARY(TAIL)  (preamble) and  LB--BOUNDARY(TAIL)  (part end):
_TAIL = re.compile(rb"(--[^\S\n\r]*%s?|[^\S\n\r]*%s)" % (_LINE_BREAK, _LINE_BREAK), re.MULTILINE)
_CR, _LF = 13, 10


class _Match:
    """The part of ``re.Match`` the decoder uses: start(), end(), group(1)."""

    __slots__ = ("_start", "_end", "_tail")

    def __init__(self, start: int, end: int, tail: bytes) -> None:
        self._start, self._end, self._tail = start, end, tail

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end

    def group(self, index: int = 0) -> bytes:
        if index != 1:
            raise IndexError("only group 1 is kept")
        return self._tail


class BoundaryPattern:
    """``search(buffer, pos)`` as werkzeug's compiled ``LB?--B(TAIL)`` (``line_break_optional``)
    or ``LB--B(TAIL)`` finds it.

    A match's marker ``--B`` is at some j found by ``find``; the regex's leftmost start for it
    is j-2 for a preceding CRLF, else j-1 for a lone CR or LF, else (optional break only) j —
    none earlier than ``pos``. A marker whose tail does not match gives no match at any of its
    starts (the tail is the same), and the search goes on with the next marker (overlaps
    included). Starts grow with j (a marker begins with ``-``, never a line break), so the
    first marker that matches gives the leftmost match."""

    __slots__ = ("_marker", "_optional")

    def __init__(self, boundary: bytes, *, line_break_optional: bool) -> None:
        self._marker = b"--" + boundary
        self._optional = line_break_optional

    def search(self, buffer: bytes | bytearray, pos: int = 0) -> _Match | None:
        marker, optional = self._marker, self._optional
        pos = max(pos, 0)
        j = buffer.find(marker, pos)
        while j != -1:
            if j - 2 >= pos and buffer[j - 2] == _CR and buffer[j - 1] == _LF:
                start = j - 2
            elif j - 1 >= pos and buffer[j - 1] in (_CR, _LF):
                start = j - 1
            else:
                start = j if optional else -1
            if start >= 0:
                tail = _TAIL.match(buffer, j + len(marker))
                if tail is not None:
                    return _Match(start, tail.end(), tail.group(1))
            j = buffer.find(marker, j + 1)
        return None


class MultipartDecoder(_wz.MultipartDecoder):
    """werkzeug's decoder with :class:`BoundaryPattern` for its two per-boundary patterns."""

    _CONSTANT = b"memeflow"  # the parent compiles its patterns for this once (re's cache after)

    def __init__(self, boundary: bytes, max_form_memory_size: int | None = None, *,
                 max_parts: int | None = None) -> None:
        super().__init__(self._CONSTANT, max_form_memory_size, max_parts=max_parts)
        self.boundary = boundary
        self.preamble_re = BoundaryPattern(boundary, line_break_optional=True)
        self.boundary_re = BoundaryPattern(boundary, line_break_optional=False)


_installed: bool | None = None
_lock = threading.Lock()

_SAMPLE_BOUNDARY = b"x7Hq-2b"
_SAMPLE = (b"preamble\r\n--x7Hq-2b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\none\r\n"
           b"--x7Hq-2b \t\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.bin\"\r\n"
           b"Content-Type: application/octet-stream\r\n\r\n\r\n--x7Hq-2bX--x7Hq-2\n\x00\xff\r"
           b"\r\n--x7Hq-2b--\r\nepilogue")


def _events(decoder_cls: type, body: bytes, chunk: int) -> list:
    decoder = decoder_cls(_SAMPLE_BOUNDARY)
    out = []
    for piece in [body[i:i + chunk] for i in range(0, len(body), chunk)] + [None]:
        decoder.receive_data(piece)
        while True:
            event = decoder.next_event()
            if isinstance(event, _wz.NeedData):
                break
            out.append(event)
            if isinstance(event, _wz.Epilogue):
                return out
    return out


def install() -> bool:
    """Make werkzeug's form parser build :class:`MultipartDecoder` (once per process); False
    if this werkzeug's decoder gives other events on the sample body (it then keeps its own)."""
    global _installed
    with _lock:
        if _installed is None:
            try:
                same = all(_events(MultipartDecoder, _SAMPLE, n) == _events(_wz.MultipartDecoder, _SAMPLE, n)
                           for n in (1, 7, len(_SAMPLE)))
            except Exception:  # noqa: BLE001 - any surprise: werkzeug's own decoder stays
                same = False
            if same and getattr(formparser, "MultipartDecoder", None) is _wz.MultipartDecoder:
                formparser.MultipartDecoder = MultipartDecoder
            _installed = formparser.MultipartDecoder is MultipartDecoder
        return _installed
