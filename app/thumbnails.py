"""Thumbnails: a derived artifact of one image *version* (its sha256), made once and cached on disk.

``<storage>/.thumbs/<namespace uuid>/<sha256>-<size>.webp``. The key is the content's sha256 (plus
the bounded size), never the image id, so a content replace (new sha256) can only ever find or make
the new version's thumbnail; the old one stays unreachable and ``memeflow gc`` removes it. The
namespace directory is the scope's own (two tenants with the same bytes share nothing). Files are
written like the originals (temp file, fsync, rename); generation of one key is serialised across
processes by an ``flock`` on one of 16 lock files per namespace, so concurrent requests for the same
new thumbnail decode the original once. The ``.thumbs`` directory is not a storage namespace:
:meth:`app.storage.FileStore.iter_keys` never lists it.

The source bytes are decoded by :func:`app.stages.images.decode_image` (the one decoder: magic bytes,
pixel limit, decompression-bomb guard); any failure is a :class:`ThumbnailError` (422), never a 500.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import itertools
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from sqlalchemy import Engine, text

from app.atomic import remove_files, write_atomic
from app.ids import parse_uuid
from app.stages.images import DEFAULT_MAX_PIXELS, decode_image

SIZES = (128, 256, 512)
DEFAULT_SIZE = 256
# Bumped when the rendering changes (filter, format, quality): old files are then never served.
RENDER_VERSION = "t1"
MEDIA_TYPE = "image/webp"
THUMBS_DIR = ".thumbs"
_NAME = re.compile(r"^(?P<sha>[0-9a-f]{64})-(?P<size>\d{2,4})-(?P<v>[a-z0-9]{1,8})\.webp$")
_TMP_PREFIX = ".tmp-"

log = logging.getLogger(__name__)


class ThumbnailError(Exception):
    """The stored image cannot be turned into a thumbnail (corrupt, not an image, too many pixels)."""

    code = "invalid_image"
    status = 422


def render_thumbnail(data: bytes, size: int, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """WebP bytes of ``data`` scaled to fit ``size``×``size`` (never enlarged). Pure."""
    if size not in SIZES:
        raise ValueError(f"thumbnail size must be one of {SIZES}")
    try:
        decoded = decode_image(data, max_pixels=max_pixels)
    except Exception as exc:  # noqa: BLE001 - PermanentError(invalid_image) or any decoder error
        raise ThumbnailError(f"cannot make a thumbnail: {exc}") from None
    image = decoded.image
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="WEBP", quality=80, method=4)
    return out.getvalue()


def etag(sha256: str, size: int) -> str:
    """The entity tag of a thumbnail: its version, its size and the rendering version."""
    return f"{sha256}-{size}-{RENDER_VERSION}"


@dataclass(frozen=True)
class Thumbnail:
    data: bytes
    etag: str
    generated: bool  # made by this call (False: read from the cache)


class ThumbnailCache:
    """The on-disk cache under ``<storage_root>/.thumbs``."""

    def __init__(self, storage_root: Path | str) -> None:
        self.root = Path(storage_root) / THUMBS_DIR

    def path(self, namespace: uuid.UUID | str, sha256: str, size: int) -> Path:
        """Where the thumbnail of (namespace, sha256, size) lives (every part validated)."""
        ns = str(uuid.UUID(str(namespace)))
        name = f"{sha256}-{int(size)}-{RENDER_VERSION}.webp"
        if not _NAME.match(name) or size not in SIZES:
            raise ValueError("invalid thumbnail key")
        return self.root / ns / name

    def get_or_create(self, namespace: uuid.UUID | str, sha256: str, size: int, source: Callable[[], bytes], *,
                      max_pixels: int = DEFAULT_MAX_PIXELS) -> Thumbnail:
        """The cached thumbnail, or make it from ``source()`` (the original's bytes) exactly once.

        A cache the filesystem will not write (disk full, read-only, permissions) costs only the
        caching: the thumbnail is made and returned all the same (logged), and made again next time."""
        target = self.path(namespace, sha256, size)
        found = _read(target)
        if found is not None:
            return Thumbnail(found, etag(sha256, size), False)
        with contextlib.ExitStack() as held:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                held.enter_context(_locked(target.parent / f".lock-{sha256[0]}"))
            except OSError as exc:
                log.warning("thumbnail cache not writable, served uncached: %s: %s", target.parent,
                            exc.strerror or exc)
                return Thumbnail(render_thumbnail(source(), size, max_pixels=max_pixels), etag(sha256, size), True)
            found = _read(target)  # made by another process while this one waited
            if found is not None:
                return Thumbnail(found, etag(sha256, size), False)
            data = render_thumbnail(source(), size, max_pixels=max_pixels)
            try:
                write_atomic(target, data, prefix=_TMP_PREFIX, sync_dir=False)  # a cache: regenerated if lost
            except OSError as exc:
                log.warning("thumbnail cache not writable, served uncached: %s: %s", target, exc.strerror or exc)
        return Thumbnail(data, etag(sha256, size), True)

    def entries(self) -> Iterator[tuple[str, str, Path]]:
        """(namespace, sha256, path) of every cached thumbnail, streamed (in no particular order)."""
        if not self.root.is_dir():
            return
        for ns_dir in sorted(d.name for d in os.scandir(self.root) if d.is_dir()):
            try:
                found = os.scandir(self.root / ns_dir)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with found:
                for f in found:
                    m = _NAME.match(f.name)
                    if m and f.is_file():
                        yield ns_dir, m.group("sha"), Path(f.path)

    def prune(self, live_versions: Iterable[tuple[str, str]] | Callable[[list[tuple[str, str]]], set[tuple[str, str]]],
              *, min_age_s: float = 0.0, now: float | None = None, dry_run: bool = False,
              namespaces: Container[str] | None = None, failed: list[tuple[Path, OSError]] | None = None,
              chunk: int = 1000) -> list[Path]:
        """Remove thumbnails of versions no image has any more, those of an older rendering
        version, and temp files of crashed writes, when older than ``min_age_s``. Returns them.
        ``live_versions``: (namespace, sha256) of every image row, or a function that tells which
        of a list of them an image row has (:func:`live_versions_among`: the cache is then read
        and checked ``chunk`` entries at a time, whatever the library's size). Racing a request is
        harmless: a thumbnail is derived, so a request that finds it gone makes it again.
        ``namespaces``: only those namespace directories are considered (the scopes of the
        database ``live_versions`` reads). ``failed``: where removals the filesystem refuses go
        (left out of the result); without it they raise."""
        if callable(live_versions):
            live_among = live_versions
        else:
            known = {(str(ns), sha) for ns, sha in live_versions}
            live_among = lambda pairs: {p for p in pairs if p in known}  # noqa: E731
        now = time.time() if now is None else now

        def doomed(paths: Iterable[Path]) -> list[Path]:
            return [p for p in paths if _age_s(p, now) >= min_age_s]

        entries = (e for e in self.entries() if namespaces is None or e[0] in namespaces)
        gone: list[Path] = []
        while batch := list(itertools.islice(entries, chunk)):
            live = live_among(sorted({(ns, sha) for ns, sha, _ in batch}))
            gone += _unlink_all(doomed(p for ns, sha, p in batch
                                       if (ns, sha) not in live or f"-{RENDER_VERSION}." not in p.name),
                                failed, dry_run=dry_run)
        if self.root.is_dir():
            temps = sorted(p for p in self.root.glob(f"*/{_TMP_PREFIX}*")
                           if p.is_file() and (namespaces is None or p.parent.name in namespaces))
            gone += _unlink_all(doomed(temps), failed, dry_run=dry_run)
        return gone


# -- live_versions: (namespace, sha256) of every image row, the versions whose thumbnails may stay --
LIVE_VERSIONS = text("SELECT DISTINCT split_part(storage_key, '/', 1) AS namespace, sha256 FROM images")


def live_versions(engine: Engine) -> set[tuple[str, str]]:
    """Every (namespace, sha256) an image row currently has."""
    with engine.connect() as conn:
        return {(r.namespace, r.sha256) for r in conn.execute(LIVE_VERSIONS)}


# -- live_versions_among: which of these (namespace, sha256) an image row has — a probe of the
# scopes' unique namespace and the images' unique (scope_id, sha256) each
LIVE_VERSIONS_AMONG = text("""
SELECT k.ns, k.sha FROM unnest(CAST(:ns AS text[]), CAST(:sha AS text[])) AS k(ns, sha)
WHERE EXISTS (SELECT 1 FROM images i
              WHERE i.scope_id = (SELECT s.id FROM scopes s WHERE s.storage_namespace = CAST(k.ns AS uuid))
                AND i.sha256 = k.sha)
""")


def live_versions_among(engine: Engine, pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of ``pairs`` ((namespace, sha256)) an image row currently has."""
    pairs = [(ns, sha) for ns, sha in pairs if parse_uuid(ns) is not None]  # a stray directory: no image's
    if not pairs:
        return set()
    with engine.connect() as conn:
        rows = conn.execute(LIVE_VERSIONS_AMONG, {"ns": [str(ns) for ns, _ in pairs], "sha": [s for _, s in pairs]})
        return {(r.ns, r.sha) for r in rows}


def _unlink_all(paths: list[Path], failed: list[tuple[Path, OSError]] | None, *, dry_run: bool) -> list[Path]:
    """Remove ``paths`` (a temp file only if no live write holds it): :func:`app.atomic.remove_files`."""
    return remove_files(paths, is_temp=lambda p: p.name.startswith(_TMP_PREFIX), failed=failed, dry_run=dry_run)


def _age_s(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return -1.0


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class _locked:
    """An exclusive ``flock`` on ``path`` (created if missing) for the duration of a ``with``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
