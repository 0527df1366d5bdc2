"""Shared by the pipeline benchmarks: generated PNGs, uploading them, and the servers to run on."""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from PIL import Image


def png(index: int) -> bytes:
    """A distinct 16×16 PNG for every index."""
    img = Image.new("RGB", (16, 16), (index % 256, (index >> 8) % 256, (index >> 16) % 256))
    img.putpixel((index % 16, (index // 16) % 16), (255, 255 - index % 256, 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def ingest_pngs(orch, settings, namespace, n: int, salt: int, publisher) -> None:
    """What an upload does for ``n`` new images of scope ``local``: store the file, ingest (one
    transaction: image + job + first task), publish the returned hints."""
    for i in range(n):
        data = png(i + salt * 7919)
        sha = hashlib.sha256(data).hexdigest()
        key = f"{namespace}/{sha}.png"
        path = settings.storage_path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        res = orch.ingest_image("local", sha256=sha, media_type="image/png", extension=".png",
                                size_bytes=len(data), width=16, height=16, storage_key=key)
        publisher.publish(res.hints)


@contextlib.contextmanager
def bench_servers(prefix: str, database_url: str | None = None,
                  broker_url: str | None = None) -> Iterator[tuple[Path, str, str]]:
    """(temp dir, database url, broker url), migrated. Without both urls, a fresh embedded
    PostgreSQL (fsync and synchronous_commit on) and Redis under the temp dir, stopped after."""
    from app.db.engine import upgrade_to_head
    from app.embedded import EmbeddedServices

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    services = None
    try:
        if not (database_url and broker_url):
            services = EmbeddedServices(tmp / "var")
            urls = services.start()
            database_url, broker_url = database_url or urls.database_url, broker_url or urls.broker_url
        upgrade_to_head(database_url)
        yield tmp, database_url, broker_url
    finally:
        if services is not None:
            with contextlib.suppress(Exception):
                services.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def preload_pg_stat_statements(*, planning: bool = False) -> None:
    """The next embedded cluster this process creates loads pg_stat_statements (every statement,
    nested ones too; ``planning``: their planning time as well). Its configuration is written when
    it is created, so the var dir must be new."""
    import app.embedded as embedded

    embedded._PG_CONF += ("shared_preload_libraries = 'pg_stat_statements'\n"
                          "pg_stat_statements.track = all\npg_stat_statements.track_utility = on\n"
                          + ("pg_stat_statements.track_planning = on\n" if planning else ""))


def create_pg_stat_statements(engine) -> None:
    """The extension's views and functions in the bench's database (after :func:`preload_pg_stat_statements`)."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
