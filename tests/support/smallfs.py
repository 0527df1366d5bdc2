"""A small real filesystem (tmpfs) mounted over a test's directory: disk full and read-only
storage, as the kernel reports them (ENOSPC, EROFS), without mocks. Needs the right to mount
(root in the test container); the test is skipped where that is missing."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def small_fs(path: Path, *, size_kb: int = 256) -> Iterator[Path]:
    """Mount a ``size_kb`` tmpfs at ``path`` (created) for the ``with`` block."""
    path.mkdir(parents=True, exist_ok=True)
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", "tmpfs", str(path))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        _run("umount", "-l", str(path))


def fill(path: Path) -> None:
    """Fill the filesystem of ``path`` until the kernel says ENOSPC (a dot file, never a storage key)."""
    with open(path / ".filler", "ab", buffering=0) as fh:
        chunk = b"\0" * 4096
        while True:
            try:
                fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


def remount_read_only(path: Path) -> None:
    done = _run("mount", "-o", "remount,ro", str(path))
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only: {done.stderr.strip()}")
    try:
        (path / ".probe").write_bytes(b"x")
    except OSError as exc:
        assert exc.errno == errno.EROFS, exc
    else:
        raise AssertionError("the remount left the filesystem writable")
