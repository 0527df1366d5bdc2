"""``/api/v1/search``: hybrid text search and look-alike visual search over current text and embeddings."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import request
from flask.views import MethodView
from werkzeug.exceptions import BadRequest

from app.api import schemas as S
from app.api import search_queries as Q
from app.api.context import Blueprint, protect, scope_id, services
from app.api.errors import ApiError, error_docs
from app.api.queries import image_file
from app.api.shares import ShareRefused
from app.api.stored import read_original
from app.api.uploads import parse_multipart, validate_bytes
from app.search import lookalike
from app.search import service as text_search
from app.search.serving import text_source, visual_source
from app.stages.errors import PermanentError
from app.stages.images import decode_image
from app.stages.vectors import vector_problem

log = logging.getLogger(__name__)

blp = protect(Blueprint("search", __name__, url_prefix="/api/v1/search", description="Search"))

@contextmanager
def _search_slot(scope: str) -> Iterator[None]:
    """A share of this API process's ``searches_per_process`` concurrent searches, at most
    ``searches_per_scope`` of them the scope's, or 429 ``too_many_searches``: a search holds a
    gunicorn thread for its embedding, ranking and (look-alike) decodes, so searches together must
    leave threads for every other request, and one tenant's burst of costly searches must leave the
    others their fair share (a scope refused for want of capacity gets the next free one on its
    retry while it holds less than its share: :mod:`app.api.shares`)."""
    svc = services()
    s = svc.settings
    try:
        share = svc.searches.acquire(scope, s.searches_per_process, per_scope=s.searches_per_scope)
    except ShareRefused as exc:
        if exc.why == "scope":
            message = (f"this scope already runs {s.searches_per_scope} searches in this API process"
                       " (MEMEFLOW_SEARCHES_PER_SCOPE); retry when one has answered")
        else:
            message = (f"this API process runs as many searches as it may (MEMEFLOW_SEARCHES_PER_PROCESS ="
                       f" {s.searches_per_process}) and this scope holds its fair share; retry in a second")
        raise ApiError(429, "too_many_searches", message, headers={"Retry-After": "1"}) from None
    try:
        yield
    finally:
        share.release()


def _text_provider() -> Any:
    """The same text provider (name and options) the embedding workers use."""
    from app.stages.providers import Providers

    return Providers(services().settings).text


def _visual_provider() -> Any:
    """The same visual provider (name and options) the visual workers use."""
    from app.stages.providers import Providers

    return Providers(services().settings).visual


@blp.route("/text")
class TextSearch(MethodView):
    @blp.arguments(S.TextSearchArgsSchema, location="query")
    @blp.response(200, S.TextSearchResultSchema)
    @blp.doc(responses=error_docs({422: "validation_error / unknown_model / query_not_embeddable", 429: "too_many_searches"}))
    def get(self, args):
        """Hybrid search (default): the query's meaning (text embeddings) and its words (lexical
        terms of any script; Chinese and Thai as bigrams) over the scope's current text; ``mode``
        picks one signal alone.
        The meaning comes from the scope's serving text model (``serving``; during a model change,
        the previous model until the scope's cutover)."""
        svc = services()
        scope = scope_id()
        with _search_slot(scope):
            source = text_source(svc.engine, scope, _text_provider(), svc.settings)
            try:
                result = text_search.search_text(
                    svc.engine, source.provider, scope, args["q"], limit=args["limit"], mode=args["mode"],
                    model=args["model"],
                )
            except text_search.UnknownModel as exc:
                raise ApiError(422, "unknown_model", str(exc)) from None
            except text_search.QueryNotEmbeddable as exc:
                raise ApiError(422, "query_not_embeddable", str(exc)) from None
        return {**result, "serving": source.info}


_VISUAL_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/VisualSearchJson"}},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                "required": ["file"],
                "additionalProperties": False,
            }
        },
    },
}


@blp.route("/visual")
class VisualSearch(MethodView):
    @blp.response(200, S.VisualSearchResultSchema)
    @blp.doc(
        requestBody=_VISUAL_BODY,
        responses=error_docs({400: "missing_file / invalid_json", 404: "not_found", 413: "payload_too_large",
                               415: "unsupported_media_type", 422: "validation_error / invalid_image / query_not_embeddable",
                               429: "too_many_searches", 503: "storage_corrupt / storage_unavailable"}),
    )
    def post(self):
        """Look-alike search by JSON ``{image_id}`` (excluded from its own results) or a multipart ``file``.

        The visual index's nearest images are re-ranked by a pixel comparison with the stored
        originals (``pixels``, ``lookalike``; app/search/lookalike.py); ``score`` stays the
        visual descriptor's cosine; a hit whose stored file does not hold its bytes keeps that
        score alone. Reads the scope's serving visual model (``serving``)."""
        _receive_body()  # before the share: a slow client's upload holds its own thread, no search share
        with _search_slot(scope_id()):
            return self._search()

    def _search(self) -> dict[str, Any]:
        svc = services()
        scope = scope_id()
        source = visual_source(svc.engine, scope, _visual_provider(), svc.settings)
        provider, model, version, dims = source.provider, source.model, source.preprocess_version, source.dims
        exclude = None
        if request.mimetype == "application/json":
            args = S.VisualSearchJsonSchema().load(_json_body())
            exclude = args["image_id"]
            row, vector = _query_image(svc, scope, exclude, source)
        elif request.mimetype == "multipart/form-data":
            args, upload = parse_multipart(S.VisualSearchFormSchema(), svc.settings)
            assert upload is not None
            vector = _query_vector(provider.embed([upload.decoded])[0], source)
        else:
            raise ApiError(415, "unsupported_media_type", "send JSON {image_id} or multipart with a 'file' part")
        hits = Q.search_visual(
            svc.engine, scope, model=model, preprocess_version=version, dims=dims, vector=vector,
            limit=max(args["limit"], lookalike.RERANK_DEPTH), exclude_image_id=exclude,
        )
        if request.mimetype == "application/json":
            query_thumbs = lookalike.cached_thumbnails(row.sha256, lambda: _load_stored(row.storage_key))
        else:
            query_thumbs = lookalike.thumbnails(upload.decoded.image)
        items = hits
        if query_thumbs is not None and hits:
            items = lookalike.rerank(hits, query_thumbs, _candidate_thumbnails(scope, hits[: lookalike.RERANK_DEPTH]))
        items = items[: args["limit"]]
        coverage = Q.visual_coverage(svc.engine, scope, model=model, preprocess_version=version)
        return {"items": items, "model": model, "coverage": coverage, "serving": source.info}


def _receive_body() -> None:
    """Read the whole request body from the client now (werkzeug keeps it: the form and files, or
    the raw bytes, for the search to parse): a search share covers the search's own work —
    embedding, ranking, decodes — never the time a slow client takes to send its upload, or a few
    trickling uploads would hold every share of the process and refuse every tenant's searches.
    A body over the upload limit is refused here, as it would be later (413)."""
    if request.mimetype == "multipart/form-data":
        request.form  # noqa: B018 - parses (and so receives) the stream; the files are kept with it
    else:
        request.get_data(cache=True)


def _query_image(svc: Any, scope: str, image_id: Any, source: Any) -> tuple[Any, list[float]]:
    """The query image of a search by id — its row (storage key, sha256) and its visual vector, of
    one version: the stored vector of that sha256, or one embedded now from its stored bytes (not
    embedded yet) — verified ones only (``read_original``: a 503 ``storage_corrupt`` or
    ``storage_unavailable`` rather than a search by other bytes). A replace committing between the
    row read and the file read removes that file: the row is read again (the image still exists;
    only a delete makes this a 404)."""
    for _ in range(3):
        row = image_file(svc.engine, scope, image_id)
        if row is None:
            raise ApiError(404, "not_found", "image not found")
        vector = Q.current_visual_vector(svc.engine, scope, image_id, model=source.model,
                                         preprocess_version=source.preprocess_version, dims=source.dims,
                                         sha256=row.sha256)
        if vector is not None:
            return row, vector
        try:  # not embedded yet: embed the stored bytes on the fly
            data = read_original(svc.store, row.storage_key)
        except FileNotFoundError:  # replaced (or deleted) since the row was read: read the row again
            continue
        return row, _query_vector(source.provider.embed([validate_bytes(data, svc.settings).decoded])[0], source)
    raise ApiError(404, "not_found", "the image file is gone")


def _query_vector(vector: Any, source: Any) -> list[float]:
    """A look-alike query's vector, through the check every stored vector passes
    (app/stages/vectors.py): 422 ``query_not_embeddable`` instead of pgvector's refusal (NaN,
    infinite, past float4) or a ranking by NaN (all zeros)."""
    values, problem = vector_problem(vector, source.dims)
    if problem is not None:
        log.warning("the visual provider %s answered a query image with an unusable vector (%s)", source.model, problem)
        raise ApiError(422, "query_not_embeddable",
                       f"the visual model {source.model} cannot embed this image (its vector is "
                       f"{problem.replace('_', ' ')})")
    assert values is not None
    return values


def _load_stored(storage_key: str) -> Any:
    """The decoded stored original, verified (``read_original``); None when its file is gone, does
    not decode, or does not hold its content (tampered or unreadable: logged there as
    ``storage_corrupt`` / ``storage_unavailable``). None leaves that image out of the pixel
    comparison — a hit is ranked by its descriptor cosine alone, a query image by id is not
    re-ranked — rather than failing the search or comparing (and caching under its sha256) other
    pixels."""
    svc = services()
    try:
        data = read_original(svc.store, storage_key)
    except (FileNotFoundError, ApiError):
        return None
    try:
        return decode_image(data, max_pixels=svc.settings.max_image_pixels).image
    except PermanentError:
        return None


def _candidate_thumbnails(scope: str, hits: list[dict]) -> dict[str, Any]:
    """Pixel thumbnails of the hits' stored originals (cached by sha256), by image id; a hit whose
    image holds other bytes now has none (its descriptor cosine alone ranks it)."""
    keys = Q.storage_keys(services().engine, scope, [(h["image"]["id"], h["image"]["sha256"]) for h in hits])
    out: dict[str, Any] = {}
    for hit in hits:
        image_id, sha = str(hit["image"]["id"]), str(hit["image"]["sha256"])
        key = keys.get(image_id)
        if key is not None:
            out[image_id] = lookalike.cached_thumbnails(sha, lambda key=key: _load_stored(key))
    return out


def _json_body() -> Any:
    """The JSON object of the request: 400 invalid_json if the body does not parse (as webargs
    answers on every other JSON endpoint), 422 if it is empty or not an object."""
    if not request.get_data(cache=True):
        raise ApiError(422, "validation_error", "the body must be a JSON object")
    try:
        body = request.get_json()
    except BadRequest:
        raise ApiError(400, "invalid_json", "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(422, "validation_error", "the body must be a JSON object")
    return body
