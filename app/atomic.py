"""Atomic file writes: a reader sees the old file or the whole new one, never a torn one (SPEC §4.1).

The one way memeflow writes a file that others read (stored images, thumbnails, agent result
records, samples): a temp file in the target's directory, fsync, rename over the target, then an
fsync of the directory so the rename itself survives a crash. A failed write removes its temp file;
a crash leaves one behind, named by ``prefix`` so its owner can find and remove it.

A temp file is ``flock``-ed by its writer from its creation until the write is done (renamed,
linked or removed), and cleaners remove one only through :func:`remove_abandoned_temp`, which
takes that lock without waiting first: a live write's temp file is never removed from under it,
however young a ``memeflow gc --min-age`` accepts; a crashed writer's lock went with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def write_atomic(
    target: Path, data: bytes, *, prefix: str = ".tmp-", suffix: str = "", durable: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replace ``target`` with ``data`` in one rename. ``durable``: fsync the file before the rename;
    ``sync_dir``: fsync the directory after it (both default on; off only for files that can be
    regenerated, where a crash may lose the write but never tear it)."""
    with held_temp(target.parent, data, prefix=prefix, suffix=suffix, durable=durable) as tmp:
        os.replace(tmp, target)
    if sync_dir:
        fsync_dir(target.parent)


@contextlib.contextmanager
def held_temp(directory: Path, data: bytes, *, prefix: str = ".tmp-", suffix: str = "",
              durable: bool = True) -> Iterator[Path]:
    """A new temp file in ``directory`` holding ``data`` (fsync'd if ``durable``), locked for the
    ``with`` block, for the caller to rename or hard-link into place — ``write_atomic``'s first
    half, also the agent records' group data file (app/stages/agent/records.py). Removed again if
    the write or the block fails."""
    while True:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
        tmp = Path(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, tmp):
                break
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)  # a cleaner removed it between its creation and the lock: take a new name
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)  # the lock goes with it


def remove_abandoned_temp(path: Path, *, dry_run: bool = False) -> bool:
    """Remove the temp file ``path`` unless a live write still holds it (its writer's lock, see the
    module docstring); True if it went (``dry_run``: would go). A filesystem refusal (read-only,
    permissions) raises."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a write in flight
        if not _same_file(fd, path):
            return False  # renamed into place (or replaced) since it was listed
        if not dry_run:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        return True
    finally:
        os.close(fd)


def remove_files(
    paths: Iterable[Path], *, is_temp: Callable[[Path], bool], failed: list[tuple[Path, OSError]] | None,
    dry_run: bool = False,
) -> list[Path]:
    """Remove ``paths`` — one ``is_temp`` names only if no live write holds it
    (:func:`remove_abandoned_temp`); those the filesystem refuses go to ``failed`` (raised without
    it). Returns those removed (``dry_run``: removable)."""
    removed: list[Path] = []
    for path in paths:
        try:
            if is_temp(path):
                if not remove_abandoned_temp(path, dry_run=dry_run):
                    continue
            elif not dry_run:
                path.unlink(missing_ok=True)
        except OSError as exc:
            if failed is None:
                raise
            failed.append((path, exc))
            continue
        removed.append(path)
    return removed


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable (a rename or unlink in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
