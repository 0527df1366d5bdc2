"""JSON for the store's documents and psycopg's json/jsonb results, on orjson (issue 21).

psycopg's jsonb loads, the store's row documents (``jsonb_to_recordset`` of a batch) and their
dumps were ≈ 15 % of a no-op worker's CPU with the standard library's ``json``
(docs/performance-log.md §23, §26); orjson does both in a fraction of that. It is used only where the
result is the same value:

- ``loads`` (psycopg's loader for json and jsonb, registered in ``engine.make_engine``): orjson
  reads an integer beyond 64 bits as a float (``json`` keeps it an int), so a document with a run
  of 19 or more digits anywhere is read by ``json`` instead — the same Python values either way.
- ``dumps`` (documents that PostgreSQL parses as jsonb, never hashed): datetimes, dataclasses and
  subclasses of the built-in types go through the same conversion ``json.dumps(default=str)``
  applies to them; a document orjson refuses (integers beyond 64 bits, keys other than str) goes
  to ``json``. Output bytes may differ from ``json``'s (a float's exponent form) but never the
  value jsonb stores.

Canonical JSON — whose bytes are hashed into fingerprints and dedupe keys — stays on ``json``
(``app.orchestrator.fingerprints.canonical_json``): its bytes must not change.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# every digit → "0" (nothing else is "0"): a run of 19 digits is then a run of 19 zeros, found by
# bytes' own search — ≈ 0.4 µs for a 150-byte document against ≈ 1.9 µs for re's \d{19}
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_RUN = b"0" * 19
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads``' value of ``data``, parsed by orjson unless it may hold an integer orjson
    would turn into a float (a run of ≥ 19 digits: |n| ≥ 10^18 can pass 2^63)."""
    raw = data if type(data) is bytes else data.encode() if isinstance(data, str) else bytes(data)
    if _RUN in raw.translate(_DIGITS):
        return json.loads(raw)
    return orjson.loads(raw)


def _default(value: Any) -> Any:
    # what json.dumps(default=str) makes of what orjson passes through (see _OPTIONS)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return str(value)


def dumps(value: Any) -> str:
    """A JSON text of ``value`` for PostgreSQL to parse (``CAST(:x AS jsonb)``): the value
    ``json.dumps(value, default=str)`` gives, by orjson where it can."""
    try:
        return orjson.dumps(value, default=_default, option=_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a non-str key, a cycle …
        return json.dumps(value, default=str)
