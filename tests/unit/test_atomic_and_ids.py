"""The shared atomic file write (app/atomic.py) and id parser (app/ids.py)."""

from __future__ import annotations

import uuid

import pytest

from app.atomic import write_atomic
from app.ids import new_id, parse_uuid


def test_write_atomic_replaces_the_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "f.bin"
    write_atomic(target, b"one")
    write_atomic(target, b"two", prefix=".tmp-", sync_dir=False)
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp_file(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_parse_uuid():
    u = uuid.uuid4()
    assert parse_uuid(u) is u
    assert parse_uuid(str(u)) == u == parse_uuid(u.hex)
    assert [parse_uuid(v) for v in ("nope", "", None, 12, "../x")] == [None] * 5


def test_new_ids_are_version_7_time_ordered_and_distinct():
    import time

    before_ms = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(2000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    stamps = [i.int >> 80 for i in ids]  # the 48-bit Unix-millisecond prefix
    assert before_ms <= min(stamps) and max(stamps) <= after_ms
    assert stamps == sorted(stamps)  # ids made later never sort before earlier milliseconds
    time.sleep(0.002)
    assert new_id() > max(ids)
