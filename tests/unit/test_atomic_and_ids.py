"""The shared atomic file write (app/atomic.py) and id parser (app/ids.py)."""

from __future__ import annotations

import uuid

import pytest

from app.atomic import write_atomic
from app.ids import parse_uuid


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
