"""The ingest loop: every file once, already-present bytes skipped, failures reported and skipped."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from PIL import Image

from app.cli.ingest import image_files, ingest_files
from app.samples import generate_samples


def _validating_uploader(calls: list[str]):
    """Stands in for POST /api/v1/images: decodes the bytes like the API, 422 when it cannot."""
    seen: dict[str, str] = {}

    def upload(path: Path, data: bytes, policy: str):
        calls.append(path.name)
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        except (OSError, SyntaxError, ValueError):
            return 422, {"error": "invalid_image", "message": "cannot decode image"}
        sha = hashlib.sha256(data).hexdigest()
        created = sha not in seen
        seen.setdefault(sha, f"id-{len(seen)}")
        return (201 if created else 200), {"created": created, "image": {"id": seen[sha]}}

    return upload


def test_corrupt_file_is_reported_and_the_rest_ingested(tmp_path):
    generate_samples(tmp_path, limit=4)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png")
    (tmp_path / "notes.txt").write_text("ignored")
    paths = image_files(tmp_path)
    assert "notes.txt" not in {p.name for p in paths}
    calls: list[str] = []
    report = ingest_files(paths, _validating_uploader(calls), policy="forbid")
    assert [Path(p).name for p, _ in report.failed] == ["broken.png"]
    assert "invalid_image" in report.failed[0][1]
    assert len(report.created) == len(paths) - 1
    assert set(report.image_ids) == {p.name for p in paths} - {"broken.png"}


def test_rerun_skips_bytes_already_in_the_scope(tmp_path):
    paths = [p for p in generate_samples(tmp_path, limit=3)]
    known = {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths[:2]}
    calls: list[str] = []
    progressed: list[str] = []
    report = ingest_files(paths, _validating_uploader(calls), known_sha256=known,
                          on_progress=lambda p: progressed.append(p.name))
    assert len(report.skipped) == 2 and len(calls) == len(paths) - 2
    assert progressed == [p.name for p in paths]
