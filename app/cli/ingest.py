"""``memeflow ingest DIR``: bulk upload through the API's own upload path (validation, atomic file
write, one-transaction ingest, publish after commit), resumable and tolerant of corrupt files."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from app.cli.common import cli_settings, friendly_errors, scope_param
from app.cli.safe_text import printable

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}

# (path, data, reverse_image_policy) -> (http status, json body)
Uploader = Callable[[Path, bytes, str], tuple[int, dict]]


@dataclass
class IngestReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    image_ids: dict[str, str] = field(default_factory=dict)


def image_files(directory: Path) -> list[Path]:
    """Image-looking files under ``directory``, in a stable order."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def ingest_files(paths: list[Path], upload: Uploader, *, policy: str = "forbid",
                 known_sha256: set[str] | None = None, on_progress: Callable[[Path], None] | None = None,
                 max_bytes: int | None = None) -> IngestReport:
    """Upload each file once: skip bytes already in the scope, record per-file failures, keep going.

    ``max_bytes`` (the API's upload limit): a larger file is reported without being read — a
    multi-gigabyte file would otherwise sit in memory, several times over, only to get a 413."""
    report = IngestReport()
    known = known_sha256 or set()
    for path in paths:
        try:
            size = path.stat().st_size
            data = None if max_bytes is not None and size > max_bytes else path.read_bytes()
        except OSError as exc:
            report.failed.append((str(path), f"unreadable: {exc}"))
        else:
            if data is None:
                report.failed.append((str(path), f"413 payload_too_large: {size} bytes, more than the "
                                                  f"{max_bytes}-byte upload limit (MEMEFLOW_MAX_UPLOAD_BYTES)"))
            elif hashlib.sha256(data).hexdigest() in known:
                report.skipped.append(str(path))
            else:
                status, body = upload(path, data, policy)
                if status in (200, 201):
                    (report.created if body.get("created") else report.existing).append(str(path))
                    report.image_ids[path.name] = body["image"]["id"]
                else:
                    report.failed.append((str(path), f"{status} {body.get('error', '')}: {body.get('message', '')}"))
        if on_progress:
            on_progress(path)
    return report


def display_name_of(path: Path) -> str:
    """The file's name as text: Linux names are bytes, and a name that is not UTF-8 (``café`` saved
    as Latin-1) reaches Python with lone surrogates, which no request can carry; those bytes become
    U+FFFD, so the image is still uploaded, under a readable name."""
    return os.fsencode(path.name).decode("utf-8", "replace")


def in_process_uploader(scope_id: str, settings) -> Uploader:
    """POST /api/v1/images on an in-process API app whose trusted scope is the operator's choice."""
    from app.api import create_app
    from app.auth import LocalScopeResolver

    app = create_app(scope_resolver=LocalScopeResolver(scope_id), settings=settings)
    client = app.test_client()

    def upload(path: Path, data: bytes, policy: str) -> tuple[int, dict]:
        import io

        name = display_name_of(path)
        resp = client.post("/api/v1/images", content_type="multipart/form-data",
                           data={"file": (io.BytesIO(data), name), "display_name": name,
                                 "reverse_image_policy": policy})
        return resp.status_code, resp.get_json(silent=True) or {}

    return upload


def http_uploader(api_url: str, token: str | None = None, timeout: float = 60.0) -> Uploader:
    """POST /api/v1/images on a running API (used by the demo)."""
    import requests

    session = requests.Session()
    if token:
        session.headers["Authorization"] = f"Bearer {token}"

    def upload(path: Path, data: bytes, policy: str) -> tuple[int, dict]:
        name = display_name_of(path)
        resp = session.post(f"{api_url.rstrip('/')}/api/v1/images", files={"file": (name, data)},
                            data={"display_name": name, "reverse_image_policy": policy}, timeout=timeout)
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, {"error": "bad_response", "message": resp.text[:200]}

    return upload


def existing_sha256(database_url: str, scope_id: str) -> set[str]:
    from sqlalchemy import text

    from app.db.engine import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return {r[0] for r in conn.execute(text("SELECT sha256 FROM images WHERE scope_id = :s"), {"s": scope_id})}
    finally:
        engine.dispose()


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--policy", type=click.Choice(["forbid", "auto"]), default="forbid", show_default=True,
              help="reverse_image_policy for new jobs")
@click.option("--scope", "scope_id", default="local", show_default=True, callback=scope_param,
              help="scope (tenant) to ingest into")
@friendly_errors
def ingest(directory: Path, policy: str, scope_id: str) -> None:
    """Upload every image under DIRECTORY (re-running skips images already present)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from app.runtime import resolve_urls
    from app.scopes import validate_scope_id

    scope_id = validate_scope_id(scope_id)
    settings = cli_settings()
    urls = resolve_urls(settings, start=False)
    settings = settings.replace(database_url=urls.database_url, broker_url=urls.broker_url)
    paths = image_files(directory)
    if not paths:
        click.echo(f"no images under {printable(directory)}", err=True)
        sys.exit(1)
    upload = in_process_uploader(scope_id, settings)
    known = existing_sha256(settings.database_url, scope_id)
    with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=False) as progress:
        bar = progress.add_task("ingest", total=len(paths))
        report = ingest_files(paths, upload, policy=policy, known_sha256=known,
                              on_progress=lambda _: progress.advance(bar), max_bytes=settings.max_upload_bytes)
    click.echo(f"created {len(report.created)}, already present {len(report.existing) + len(report.skipped)}, "
               f"failed {len(report.failed)}")
    for path, why in report.failed:
        click.echo(f"  failed: {printable(path)}: {printable(why)}", err=True)
    sys.exit(1 if report.failed else 0)
