"""Ids: parsing those that arrive as text (paths, CLI arguments, hint bodies) — one parser for every
surface — and making new time-ordered ones for the rows the pipeline writes most."""

from __future__ import annotations

import os
import time
import uuid


def parse_uuid(value: object) -> uuid.UUID | None:
    """``value`` as a UUID (a UUID is returned as is), or None when it is not one — each caller
    decides what that means (404, a usage error, a dropped hint)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError):
        return None


def new_id() -> uuid.UUID:
    """A new time-ordered id (UUID version 7, RFC 9562: 48 bits of Unix milliseconds, then 74
    random bits). Rows made together get nearby keys, so their B-tree index entries share pages:
    inserts touch the right-hand edge of an index and the retention walk's per-row lookups (a job's
    tasks, an image's latest revision) stay local instead of reading a random leaf each."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 for rand_a, 62 for rand_b (6 spare)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | rand & (1 << 62) - 1
    return uuid.UUID(int=value)
