"""Upload validation: size limit, media type from magic bytes, decode with a pixel limit.

Nothing is written until the bytes have been fully validated; the orchestrator then writes the
file atomically inside the transaction that inserts its row (under the storage key's lock, see
``app.orchestrator.files``), and removes it again if that transaction fails.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from flask import request
from marshmallow import Schema

from app.api.errors import UNKNOWN_FIELD, ApiError, validation_error
from app.stages.images import EXTENSIONS, check_image, decode_image, sniff_media_type


@dataclass(frozen=True)
class ValidatedUpload:
    data: bytes
    sha256: str
    media_type: str
    extension: str
    width: int
    height: int
    decoded: Any  # the DecodedImage (visual search embeds it without decoding twice); None: not built

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _decode(data: bytes, media_type: str, max_pixels: int) -> tuple[int, int, Any]:
    """Full decode with the workers' rules (one decoder for the whole system)."""
    try:
        decoded = decode_image(data, max_pixels=max_pixels)
    except Exception as exc:  # noqa: BLE001 - PermanentError(invalid_image) and any decoder error
        raise ApiError(422, "invalid_image", str(exc) or "cannot decode image") from None
    return decoded.width, decoded.height, decoded


def _check(data: bytes, max_pixels: int) -> tuple[int, int, None]:
    """The same validation without building the RGB image (``check_image``: an upload stores bytes)."""
    try:
        width, height, _ = check_image(data, max_pixels=max_pixels)
    except Exception as exc:  # noqa: BLE001 - PermanentError(invalid_image) and any decoder error
        raise ApiError(422, "invalid_image", str(exc) or "cannot decode image") from None
    return width, height, None


def validate_bytes(data: bytes, settings: Any, *, pixels: bool = True) -> ValidatedUpload:
    """Validate raw image bytes (already known to be within the size limit). ``pixels=False``: the
    caller only stores the bytes, so the RGB image is not built (``decoded`` is None) — the
    validation is the same."""
    if len(data) == 0:
        raise ApiError(422, "invalid_image", "the file is empty (zero bytes)")
    media_type = sniff_media_type(data)
    if media_type is None:
        raise ApiError(415, "unsupported_media_type", "not a png, jpeg, gif or webp image (by its magic bytes)")
    if pixels:
        width, height, decoded = _decode(data, media_type, settings.max_image_pixels)
    else:
        width, height, decoded = _check(data, settings.max_image_pixels)
    return ValidatedUpload(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        media_type=media_type,
        extension=EXTENSIONS[media_type],
        width=width,
        height=height,
        decoded=decoded,
    )


def parse_multipart(
    form_schema: Schema, settings: Any, *, file_required: bool = True, pixels: bool = True
) -> tuple[dict, ValidatedUpload | None]:
    """Parse a multipart request: strict form fields, exactly one ``file`` part, validated bytes.

    Werkzeug enforces ``MAX_CONTENT_LENGTH`` while streaming (chunked bodies included); the file
    part is checked again against ``max_upload_bytes`` because multipart framing adds overhead.
    """
    if request.mimetype != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send the image as multipart/form-data with a 'file' part")
    form = request.form  # parses the stream; 413 raised here when over the limit
    unknown_files = [k for k in request.files if k != "file"]
    if unknown_files:
        raise validation_error({k: [UNKNOWN_FIELD] for k in unknown_files})
    raw: dict[str, Any] = {}
    for key in form:
        if key == "file":  # a text field named "file" is not a file part
            continue
        values = form.getlist(key)
        raw[key] = values[0] if len(values) == 1 else values
    args = form_schema.load(raw)  # ValidationError → 422 via the error handler
    files = request.files.getlist("file")
    if not files:
        if file_required:
            raise ApiError(400, "missing_file", "the multipart request has no 'file' part")
        return args, None
    if len(files) > 1:
        raise validation_error({"file": ["Give exactly one file."]})
    limit = settings.max_upload_bytes
    data = files[0].stream.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, "payload_too_large", f"the file exceeds the upload limit of {limit} bytes")
    return args, validate_bytes(data, settings, pixels=pixels)
