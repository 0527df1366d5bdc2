"""``/api/v1/images``: upload, list, read, content, thumbnail, replace, edit, delete, process."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Response, request
from flask.views import MethodView

from app import thumbnails
from app.api import schemas as S
from app.api.context import Blueprint, limit_rate, protect, publish, scope_id, services
from app.api.errors import ApiError, error_docs
from app.api.queries import image_file
from app.api.stored import read_original
from app.api.uploads import ValidatedUpload, parse_multipart
from app.metrics import THUMBNAILS_GENERATED
from app.stages.images import EXTENSIONS
from app.storage import storage_key
from app.web.headers import mark_user_file

blp = protect(Blueprint("images", __name__, url_prefix="/api/v1/images", description="Images"))

# A reader of an image's file reads its row, then the file; a replace or delete that commits in
# between removes that file, so the reader looks at the row again (each round means another
# change committed meanwhile: a few are plenty).
_FILE_READS = 3

_UPLOAD_ERRORS = {
    400: "missing_file", 403: "quota_exceeded", 409: "generation_policy_conflict", 413: "payload_too_large",
    415: "unsupported_media_type", 422: "invalid_image / invalid_reverse_image_policy / invalid_text / validation_error",
    429: "rate_limited", 503: "storage_unavailable", 507: "storage_full",
}


# one instance each, as flask-smorest keeps for @blp.arguments: building a Schema deep-copies its
# fields (≈ 45 µs per upload); loading through it keeps no state
_UPLOAD_FORM = S.UploadFormSchema()
_NO_FORM = S.StrictSchema()


def _multipart_body(with_form: bool) -> dict[str, Any]:
    props: dict[str, Any] = {"file": {"type": "string", "format": "binary"}}
    if with_form:
        props.update(
            display_name={"type": "string", "maxLength": 500},
            reverse_image_policy={"type": "string", "enum": S.POLICIES, "default": "forbid"},
            process={"type": "boolean", "default": True},
        )
    return {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "properties": props, "required": ["file"], "additionalProperties": False}
            }
        },
    }


def original_file_name(image_id: uuid.UUID, media_type: str) -> str:
    """The name a browser is given for an image's original: its id and the sniffed type's extension."""
    return f"{image_id}{EXTENSIONS.get(media_type, '')}"


def file_key(upload: ValidatedUpload, scope: str) -> str:
    """The content-addressed key of the validated bytes under the scope's namespace. The file
    itself is written by the orchestrator, in the transaction that references it."""
    namespace = services().orchestrator.ensure_scope(scope)
    return storage_key(namespace, upload.sha256, upload.extension)


@blp.route("")
class Images(MethodView):
    @blp.arguments(S.PageArgsSchema, location="query")
    @blp.response(200, S.ImageListSchema)
    @blp.doc(responses=error_docs({422: "invalid_cursor"}))
    def get(self, args):
        """List images of the scope, oldest first (keyset pagination)."""
        svc = services()
        after = svc.cursors.decode(args.get("cursor"), "images", scope_id())
        items, next_key = svc.orchestrator.list_images(scope_id(), after=after, limit=args["limit"])
        return {"items": items, "next_cursor": svc.cursors.encode(next_key, "images", scope_id())}

    @blp.response(201, S.UploadResultSchema)
    @blp.alt_response(200, schema=S.UploadResultSchema, description="identical bytes: the existing image")
    @blp.doc(requestBody=_multipart_body(True), responses=error_docs(_UPLOAD_ERRORS))
    def post(self):
        """Upload an image (multipart ``file``); creates its job unless ``process=false``."""
        limit_rate("uploads")
        svc = services()
        args, upload = parse_multipart(_UPLOAD_FORM, svc.settings, pixels=False)
        assert upload is not None
        scope = scope_id()
        result = svc.orchestrator.ingest_image(  # the key is resolved in its transaction (no round trip here)
            scope, **_stored_file(upload, scope, svc.store, key=False), display_name=args.get("display_name"),
            reverse_image_policy=args["reverse_image_policy"], process=args["process"],
        )
        publish(result.hints)
        body = {"image": result.image, "job": result.job, "created": result.created}
        return body, (201 if result.created else 200)


def _stored_file(upload: Any, scope: str, store: Any, *, key: bool = True) -> dict[str, Any]:
    """What an upload and a content replace hand the orchestrator: the validated file's facts,
    its content-addressed key (``key=False``: None, the orchestrator resolves it in its
    transaction), and the bytes with the store to write them to (under its lock)."""
    return {
        "sha256": upload.sha256, "media_type": upload.media_type, "extension": upload.extension,
        "size_bytes": upload.size_bytes, "width": upload.width, "height": upload.height,
        "storage_key": file_key(upload, scope) if key else None, "files": store, "data": upload.data,
    }


@blp.route("/<uuid:image_id>")
class ImageById(MethodView):
    @blp.response(200, S.ImageSchema)
    @blp.doc(responses=error_docs({404: "not_found"}))
    def get(self, image_id: uuid.UUID):
        """One image with its context and latest job summary."""
        return services().orchestrator.get_image(scope_id(), image_id)

    @blp.arguments(S.ImagePatchSchema)
    @blp.response(200, S.ImageJobSchema)
    @blp.doc(responses=error_docs({404: "not_found", 409: "context_generation_in_progress", 415: "unsupported_media_type",
                                   429: "rate_limited"}))
    def patch(self, args, image_id: uuid.UUID):
        """Edit display_name and/or context; a new metadata hash re-runs the text stage."""
        limit_rate("processing")  # an edit plans a job, as a process request does
        svc = services()
        result = svc.orchestrator.edit_context(scope_id(), image_id, **args)
        publish(result.hints)
        return {"image": result.image, "job": result.job}

    @blp.response(204)
    @blp.doc(responses=error_docs({404: "not_found"}))
    def delete(self, image_id: uuid.UUID):
        """Delete the image, its jobs, tasks and artifacts; the file goes after the commit."""
        svc = services()
        publish(svc.orchestrator.delete_image(scope_id(), image_id, files=svc.store))


@blp.route("/<uuid:image_id>/content")
class ImageContent(MethodView):
    @blp.doc(
        responses={
            "200": {
                "description": "the image bytes; ETag is the sha256",
                "content": {mt: {"schema": {"type": "string", "format": "binary"}} for mt in
                            ("image/png", "image/jpeg", "image/gif", "image/webp")},
            },
            "304": {"description": "not modified (If-None-Match matched)"},
            **error_docs({404: "not_found", 503: "storage_corrupt / storage_unavailable"}),
        }
    )
    def get(self, image_id: uuid.UUID):
        """The stored bytes with the right Content-Type; honours If-None-Match."""
        svc = services()
        for _ in range(_FILE_READS):
            row = image_file(svc.engine, scope_id(), image_id)
            if row is None:
                raise ApiError(404, "not_found", "image not found")
            if request.if_none_match.contains(row.sha256):
                resp = Response(status=304)
                break
            try:
                data = read_original(svc.store, row.storage_key)  # 503 storage_corrupt: never other bytes
            except FileNotFoundError:  # replaced (or deleted) since the row was read: read the row again
                continue
            resp = Response(data, mimetype=row.media_type)
            break
        else:
            raise ApiError(404, "not_found", "the image file is gone")
        resp.set_etag(row.sha256)
        resp.headers["Cache-Control"] = "private, no-cache"
        return mark_user_file(resp, original_file_name(image_id, row.media_type))

    @blp.response(200, S.ImageJobSchema)
    @blp.doc(requestBody=_multipart_body(False), responses=error_docs(
        {**_UPLOAD_ERRORS, 404: "not_found", 409: "duplicate_image / generation_policy_conflict"}))
    def put(self, image_id: uuid.UUID):
        """Replace the image's bytes; the active job ends target_changed and a new one starts."""
        limit_rate("uploads")
        svc = services()
        _, upload = parse_multipart(_NO_FORM, svc.settings, pixels=False)
        assert upload is not None
        scope = scope_id()
        svc.orchestrator.get_image(scope, image_id)  # 404 before any file is written
        result = svc.orchestrator.replace_content(scope, image_id, **_stored_file(upload, scope, svc.store))
        publish(result.hints)
        return {"image": result.image, "job": result.job}


@blp.route("/<uuid:image_id>/thumbnail")
class ImageThumbnail(MethodView):
    @blp.arguments(S.ThumbnailArgsSchema, location="query")
    @blp.doc(
        responses={
            "200": {"description": "a WebP thumbnail of the current version; ETag names version and size",
                    "content": {thumbnails.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
            "304": {"description": "not modified (If-None-Match matched)"},
            **error_docs({404: "not_found", 422: "invalid_image / validation_error",
                          503: "storage_corrupt / storage_unavailable"}),
        }
    )
    def get(self, args, image_id: uuid.UUID):
        """A thumbnail of the image's current version (made once, then served from the cache).

        With ``v=<sha256>`` the answer is for that version only (404 once it is replaced) and may be
        cached for good; without it, clients revalidate with the ETag."""
        svc = services()
        size = args["size"]
        for _ in range(_FILE_READS):
            row = image_file(svc.engine, scope_id(), image_id)
            if row is None or ("v" in args and args["v"] != row.sha256):
                raise ApiError(404, "not_found",
                               "image not found" if row is None else "that version of the image is gone")
            tag = thumbnails.etag(row.sha256, size)
            if request.if_none_match.contains(tag):
                resp = Response(status=304)
                break
            made = _thumbnail(svc, row, size)
            if made is not None:  # None: the original was replaced (or deleted) since the row was read
                resp = Response(made.data, mimetype=thumbnails.MEDIA_TYPE)
                break
        else:
            raise ApiError(404, "not_found", "the image file is gone")
        resp.set_etag(tag)
        resp.headers["Cache-Control"] = "private, max-age=31536000, immutable" if "v" in args else "private, no-cache"
        return mark_user_file(resp, f"{image_id}-{size}{EXTENSIONS[thumbnails.MEDIA_TYPE]}")


class _OriginalGone(Exception):
    """The stored original of the row a thumbnail was asked for is gone."""


def _thumbnail(svc: Any, row: Any, size: int) -> thumbnails.Thumbnail | None:
    """The cached thumbnail of this row's version, made from the stored original if missing;
    None when that original is gone (a replace or delete committed after the row was read)."""
    def source() -> bytes:
        try:  # verified: a thumbnail of other bytes would be cached for this sha256 for good
            return read_original(svc.store, row.storage_key)
        except FileNotFoundError:
            raise _OriginalGone() from None

    cache = thumbnails.ThumbnailCache(svc.store.root)
    namespace = row.storage_key.split("/", 1)[0]
    try:
        made = cache.get_or_create(namespace, row.sha256, size, source, max_pixels=svc.settings.max_image_pixels)
    except _OriginalGone:
        return None
    except thumbnails.ThumbnailError as exc:
        raise ApiError(exc.status, exc.code, str(exc)) from None
    if made.generated:
        THUMBNAILS_GENERATED.inc()
    return made


@blp.route("/<uuid:image_id>/process")
class ImageProcess(MethodView):
    @blp.arguments(S.ProcessSchema)
    @blp.response(201, S.JobCreatedSchema)
    @blp.alt_response(200, schema=S.JobCreatedSchema, description="every stage already valid: the latest job")
    @blp.doc(responses=error_docs({404: "not_found", 409: "generation_policy_conflict", 415: "unsupported_media_type",
                                   422: "invalid_stage", 429: "rate_limited"}))
    def post(self, args, image_id: uuid.UUID):
        """Explicitly (re)process an image; ``force_stages`` re-runs the listed stages."""
        limit_rate("processing")
        svc = services()
        force = tuple(dict.fromkeys(args["force_stages"]))
        result = svc.orchestrator.request_processing(
            scope_id(),
            image_id,
            mode="full_retry" if force else "explicit",
            reverse_image_policy=args["reverse_image_policy"],
            force_stages=force,
        )
        publish(result.hints)
        return {"job": result.job, "created": result.created}, (201 if result.created else 200)
