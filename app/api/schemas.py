"""Marshmallow schemas for every request and response of SPEC §6.

Request schemas reject unknown fields (marshmallow's default ``RAISE``, kept explicit); response
schemas define the documented shapes (fields may be added, never renamed). The OpenAPI document
is generated from these same classes by flask-smorest.
"""

from __future__ import annotations

import re

from marshmallow import (
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates_schema,
)

from app import thumbnails
from app.db.enums import (
    STAGE_ORDER,
    BatchStatus,
    ContextStatus,
    JobMode,
    JobStatus,
    ReverseImagePolicy,
    ServingKind,
    StageStatus,
)
from app.orchestrator.batches import MAX_BATCH_IDS
from app.stages.agent import limits
from app.stages.agent.context_text import normalise_tags, single_line

POLICIES = [p.value for p in ReverseImagePolicy]
STAGES = [s.value for s in STAGE_ORDER]
MAX_IMAGE_IDS = MAX_BATCH_IDS  # over it: 422 before any id is parsed into the orchestrator


class DateTime(fields.DateTime):
    """ISO-8601 timestamp; passes through values the orchestrator already rendered as strings."""

    def _serialize(self, value, attr, obj, **kwargs):
        if isinstance(value, str):
            return value
        return super()._serialize(value, attr, obj, **kwargs)


# --- text that PostgreSQL can store -----------------------------------------------------------

INVALID_TEXT = "must not contain NUL characters or unpaired surrogates"
# U+0000 (PostgreSQL rejects it in text and jsonb) and UTF-16 surrogates, which a JSON "\ud800"
# escape turns into a str that no UTF-8 encoder accepts.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def has_unstorable_text(value: str) -> bool:
    """True if ``value`` holds a character PostgreSQL cannot store in text or jsonb."""
    return _UNSTORABLE.search(value) is not None


def storable_text(value: str) -> None:
    """Validator: reject a string PostgreSQL cannot store (the API answers 422 ``invalid_text``)."""
    if has_unstorable_text(value):
        raise ValidationError(INVALID_TEXT)


class Text(fields.String):
    """A string field that only loads text PostgreSQL can store (see :func:`storable_text`).

    Every request field whose value reaches a text or jsonb column, or a query, is a ``Text``.
    """

    def _deserialize(self, value, attr, data, **kwargs):
        out = super()._deserialize(value, attr, data, **kwargs)
        storable_text(out)
        return out


class SingleLineText(Text):
    """A ``Text`` kept as one line (:func:`~app.stages.agent.context_text.single_line`: trimmed,
    whitespace runs and line breaks one space); its validators see the normalised value."""

    def _deserialize(self, value, attr, data, **kwargs):
        return single_line(super()._deserialize(value, attr, data, **kwargs))


class BoundedList(fields.List):
    """A ``List`` that refuses a list longer than ``max_items`` before reading any item: marshmallow
    reads every item before a ``Length`` validator runs, and a body of a million items held an API
    thread for seconds (3.4 s for a million tags). A ``Length`` validator may stay, for the
    OpenAPI document's ``maxItems``."""

    def __init__(self, inner, *, max_items: int, **kwargs):
        super().__init__(inner, **kwargs)
        self.max_items = max_items

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, list | tuple) and len(value) > self.max_items:
            raise ValidationError(f"Longer than maximum length {self.max_items}.")
        return super()._deserialize(value, attr, data, **kwargs)


#: Tags a PATCH may send, before empty and repeated ones are dropped (``Tags``); at most
#: ``limits.TAGS_MAX`` are stored.
TAGS_SENT_MAX = 10 * limits.TAGS_MAX


class Tags(BoundedList):
    """A list of tags as :func:`~app.stages.agent.context_text.normalise_tags` writes them (no
    empty tag, none twice by case or width); the list's validators (its length) see that list."""

    def __init__(self, inner, **kwargs):
        super().__init__(inner, max_items=TAGS_SENT_MAX, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        return normalise_tags(super()._deserialize(value, attr, data, **kwargs))


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE


# --- shared pieces --------------------------------------------------------------------------

class ErrorSchema(Schema):
    error = fields.String(required=True, metadata={"description": "stable snake_case error code"})
    message = fields.String(required=True)
    details = fields.Dict(metadata={"description": "optional machine-readable details"})


class PageArgsSchema(Schema):
    cursor = fields.String(validate=validate.Length(max=2048))
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))


class ErrorInfoSchema(Schema):
    code = fields.String(allow_none=True)
    message = fields.String(allow_none=True)


# --- context --------------------------------------------------------------------------------

class ContextSchema(StrictSchema):
    """Editable context keys; anything else is rejected (422). The title is stored as one line and
    the tags normalised (:mod:`app.stages.agent.context_text`) before their limits are checked."""

    title = SingleLineText(validate=validate.Length(max=limits.TITLE_MAX))
    description = Text(validate=validate.Length(max=limits.DESCRIPTION_MAX))
    ocr_text = Text(validate=validate.Length(max=limits.OCR_TEXT_MAX))
    tags = Tags(SingleLineText(validate=validate.Length(max=limits.TAG_MAX)),
                validate=validate.Length(max=limits.TAGS_MAX))


# --- images ---------------------------------------------------------------------------------

class JobRefSchema(Schema):
    id = fields.UUID(required=True)
    status = fields.String(required=True)


class ImageSchema(Schema):
    id = fields.UUID(required=True)
    display_name = fields.String(allow_none=True)
    sha256 = fields.String(required=True)
    media_type = fields.String(required=True)
    size_bytes = fields.Integer(required=True)
    width = fields.Integer(required=True)
    height = fields.Integer(required=True)
    context = fields.Dict(allow_none=True)
    context_status = fields.String(validate=validate.OneOf([s.value for s in ContextStatus]))
    metadata_hash = fields.String(allow_none=True)
    revision = fields.Integer()
    created_at = DateTime()
    updated_at = DateTime()
    latest_job = fields.Nested(JobRefSchema, allow_none=True)


class UploadFormSchema(StrictSchema):
    """Multipart form fields of ``POST /images`` (the file itself is the ``file`` part)."""

    display_name = Text(validate=validate.Length(max=500))
    reverse_image_policy = fields.String(load_default="forbid", validate=validate.OneOf(POLICIES))
    process = fields.Boolean(load_default=True)


class ImagePatchSchema(StrictSchema):
    display_name = Text(allow_none=True, validate=validate.Length(max=500))
    context = fields.Nested(ContextSchema)

    @validates_schema
    def _not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give display_name and/or context")


class ProcessSchema(StrictSchema):
    reverse_image_policy = fields.String(load_default="forbid", validate=validate.OneOf(POLICIES))
    force_stages = BoundedList(fields.String(validate=validate.OneOf(STAGES)), max_items=len(STAGES),
                               load_default=list, validate=validate.Length(max=len(STAGES)))


class ThumbnailArgsSchema(StrictSchema):
    size = fields.Integer(load_default=thumbnails.DEFAULT_SIZE, validate=validate.OneOf(thumbnails.SIZES),
                          metadata={"description": "the bounding box's side in pixels: 128, 256 (default) or 512"})
    v = fields.String(validate=validate.Regexp(r"^[0-9a-f]{64}$"),
                      metadata={"description": "the image version (sha256) the caller expects; another "
                                               "version is 404, and a matching one may be cached for good"})


class ImageListSchema(Schema):
    items = fields.List(fields.Nested(ImageSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)


# --- jobs -----------------------------------------------------------------------------------

class StageSchema(Schema):
    stage = fields.String(required=True, validate=validate.OneOf(STAGES))
    status = fields.String(required=True, validate=validate.OneOf([s.value for s in StageStatus]))
    task_id = fields.UUID(allow_none=True)
    attempt_count = fields.Integer()
    error = fields.Nested(ErrorInfoSchema, allow_none=True)
    retry_at = DateTime(allow_none=True)
    updated_at = DateTime(allow_none=True)


class JobSchema(Schema):
    id = fields.UUID(required=True)
    image_id = fields.UUID(required=True)
    revision = fields.Integer()
    status = fields.String(required=True, validate=validate.OneOf([s.value for s in JobStatus]))
    mode = fields.String(validate=validate.OneOf([m.value for m in JobMode]))
    reverse_image_policy = fields.String(validate=validate.OneOf(POLICIES))
    image_sha256 = fields.String()
    current_stage = fields.String(allow_none=True)
    progress = fields.Float()
    error = fields.Nested(ErrorInfoSchema, allow_none=True)
    retry_at = DateTime(allow_none=True)
    batch_id = fields.UUID(allow_none=True)
    created_at = DateTime()
    updated_at = DateTime()
    completed_at = DateTime(allow_none=True)
    stages = fields.List(fields.Nested(StageSchema))


class JobListArgsSchema(PageArgsSchema):
    status = fields.String(validate=validate.OneOf([s.value for s in JobStatus]))
    image_id = fields.UUID()


class JobListSchema(Schema):
    items = fields.List(fields.Nested(JobSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)


class JobEnvelopeSchema(Schema):
    job = fields.Nested(JobSchema, required=True)


class JobCreatedSchema(Schema):
    job = fields.Nested(JobSchema, required=True)
    created = fields.Boolean(required=True)


class UploadResultSchema(Schema):
    image = fields.Nested(ImageSchema, required=True)
    job = fields.Nested(JobSchema, allow_none=True, required=True)
    created = fields.Boolean(required=True)


class ImageJobSchema(Schema):
    image = fields.Nested(ImageSchema, required=True)
    job = fields.Nested(JobSchema, allow_none=True, required=True)


# --- tasks ----------------------------------------------------------------------------------

class AttemptSchema(Schema):
    attempt_no = fields.Integer()
    attempt_id = fields.String()
    state = fields.String()
    claim_generation = fields.Integer()
    error = fields.Dict(allow_none=True)
    # its agent could run it again after a worker's death (docs/providers.md, "Recall-safe agents")
    recall_safe = fields.Boolean()
    created_at = DateTime()
    updated_at = DateTime()


class TaskSchema(Schema):
    id = fields.UUID(required=True)
    job_id = fields.UUID()
    image_id = fields.UUID()
    stage = fields.String()
    lane = fields.String()
    status = fields.String(required=True)
    priority = fields.Integer()
    attempt_count = fields.Integer()
    max_attempts = fields.Integer()
    available_at = DateTime(allow_none=True)
    lease_expires_at = DateTime(allow_none=True)
    claim_generation = fields.Integer()
    cancel_requested = fields.Boolean()
    error = fields.Dict(allow_none=True)
    result = fields.Dict(allow_none=True)
    created_at = DateTime()
    updated_at = DateTime()
    started_at = DateTime(allow_none=True)
    completed_at = DateTime(allow_none=True)
    attempts = fields.List(fields.Nested(AttemptSchema))


# --- batches --------------------------------------------------------------------------------

class BatchCreateSchema(StrictSchema):
    all = fields.Boolean(load_default=False)
    image_ids = BoundedList(fields.UUID(), max_items=MAX_IMAGE_IDS, validate=validate.Length(min=1, max=MAX_IMAGE_IDS))
    reverse_image_policy = fields.String(load_default="forbid", validate=validate.OneOf(POLICIES))

    @validates_schema
    def _target(self, data, **kwargs):
        if bool(data.get("all")) == bool(data.get("image_ids")):
            raise ValidationError("give either all=true or a non-empty image_ids list (not both)")


class BatchSchema(Schema):
    id = fields.UUID(required=True)
    status = fields.String(required=True, validate=validate.OneOf([s.value for s in BatchStatus]))
    total = fields.Integer(required=True)
    counts = fields.Dict(keys=fields.String(), values=fields.Integer())
    progress = fields.Float()
    reverse_image_policy = fields.String()
    created_at = DateTime()
    updated_at = DateTime()
    completed_at = DateTime(allow_none=True)


class BatchEnvelopeSchema(Schema):
    batch = fields.Nested(BatchSchema, required=True)


# --- search ---------------------------------------------------------------------------------

MAX_QUERY_CHARS = 512  # a search query longer than this is a 422 (a query, not a document)


def not_blank(value: str) -> None:
    """Validator: reject a string that is empty or only whitespace."""
    if not value.strip():
        raise ValidationError("must not be empty or only whitespace")


class TextSearchArgsSchema(Schema):
    q = Text(required=True, validate=[validate.Length(min=1, max=MAX_QUERY_CHARS), not_blank],
             metadata={"description": f"1 to {MAX_QUERY_CHARS} characters, not only whitespace"})
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))
    mode = fields.String(load_default="hybrid", validate=validate.OneOf(["hybrid", "semantic", "lexical"]),
                         metadata={"description": "hybrid (default): semantic + lexical; or one signal alone"})
    model = Text(load_default=None, validate=validate.Length(min=1, max=200),
                          metadata={"description": "semantic signal from this one model of the configured "
                                                   "text provider (see `models` in the response)"})


class VisualSearchJsonSchema(StrictSchema):
    image_id = fields.UUID(required=True)
    # strict: a JSON limit is a number of the JSON type integer (1.5 is not truncated, "5" not parsed)
    limit = fields.Integer(load_default=20, strict=True, validate=validate.Range(min=1, max=100))


class VisualSearchFormSchema(StrictSchema):
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))


class SearchHitSchema(Schema):
    image = fields.Nested(ImageSchema, required=True)
    score = fields.Float(required=True)


class SignalMatchSchema(Schema):
    rank = fields.Integer(required=True, metadata={"description": "1-based rank in this signal's own list"})
    score = fields.Float(required=True)
    terms = fields.List(fields.String(), metadata={"description": "lexical: the query terms the text contains"})


class NearMatchSchema(Schema):
    terms = fields.List(fields.String(), required=True,
                        metadata={"description": "query terms the text holds only one edit away (an OCR misread)"})
    lexical_score = fields.Float(required=True, metadata={"description": "the lexical score with them (half weight)"})


class MatchedSchema(Schema):
    semantic = fields.Nested(SignalMatchSchema)
    lexical = fields.Nested(SignalMatchSchema)
    near = fields.Nested(NearMatchSchema)


class HighlightSchema(Schema):
    field = fields.String(required=True, metadata={"description": "ocr_text, title, description, display_name or tags"})
    text = fields.String(required=True, metadata={"description": "a short window of that field"})
    marks = fields.List(fields.List(fields.Integer()), required=True,
                        metadata={"description": "[start, end) spans of the matches in `text`, in characters "
                                                 "(Unicode code points, not UTF-16 units)"})


class TextSearchHitSchema(SearchHitSchema):
    matched = fields.Nested(MatchedSchema, required=True)
    highlight = fields.Nested(HighlightSchema, allow_none=True)


class CoverageSchema(Schema):
    ready = fields.Integer(required=True)
    total = fields.Integer(required=True)


class SearchModelSchema(Schema):
    name = fields.String(required=True)
    weight = fields.Float(required=True, metadata={"description": "this model's weight in this query's vector"})
    stored_as = fields.String(required=True, metadata={"description": "the text_embeddings model that holds it"})
    coverage = fields.Nested(CoverageSchema, required=True)


class LexicalInfoSchema(Schema):
    terms = fields.List(fields.String(), required=True)
    coverage = fields.Nested(CoverageSchema, required=True)


class ServingTargetSchema(Schema):
    model = fields.String(required=True)
    coverage = fields.Nested(CoverageSchema, required=True,
                             metadata={"description": "images with a context, and those with a current "
                                                      "embedding of the target (as of the last check)"})


class ServingInfoSchema(Schema):
    state = fields.String(required=True, metadata={"description": "serving | backfill | pinned | unset"})
    epoch = fields.Integer(required=True, metadata={"description": "bumped by every switch of the scope's reads"})
    model = fields.String(required=True, metadata={"description": "the model that answered this query"})
    target = fields.Nested(ServingTargetSchema, allow_none=True,
                           metadata={"description": "the model being filled during a model change"})
    switched_at = fields.String(allow_none=True)
    fallback = fields.Boolean(metadata={"description": "true: the serving model could not be built here; "
                                                       "the configured one answered"})


class QueryBankInfoSchema(Schema):
    applied = fields.Boolean(required=True, metadata={
        "description": "true: the top candidates were re-ordered by query-bank normalisation (a hub "
                       "document lost a near tie; docs/search.md)"})


class TextSearchResultSchema(Schema):
    items = fields.List(fields.Nested(TextSearchHitSchema), required=True)
    mode = fields.String(required=True)
    model = fields.String(required=True)
    models = fields.List(fields.Nested(SearchModelSchema), required=True)
    coverage = fields.Nested(CoverageSchema, required=True)
    lexical = fields.Nested(LexicalInfoSchema, allow_none=True)
    query_bank = fields.Nested(QueryBankInfoSchema, allow_none=True, metadata={
        "description": "null unless the text model has a query-bank part and the query was embedded"})
    serving = fields.Nested(ServingInfoSchema, metadata={"description": "the scope's search serving state"})


class VisualSearchHitSchema(SearchHitSchema):
    pixels = fields.Float(metadata={"description": "correlation of the two images' colour thumbnails (-1..1), "
                                                   "for the re-ranked nearest hits"})
    lookalike = fields.Float(metadata={"description": "what the re-ranked hits are ordered by: the mean of the "
                                                      "descriptor cosine (score) and the thumbnail correlations"})


class VisualSearchResultSchema(Schema):
    items = fields.List(fields.Nested(VisualSearchHitSchema), required=True)
    model = fields.String()
    coverage = fields.Nested(CoverageSchema)
    serving = fields.Nested(ServingInfoSchema, metadata={"description": "the scope's visual serving state"})


class ServingArgsSchema(Schema):
    kind = fields.String(load_default="text", validate=validate.OneOf([k.value for k in ServingKind]),
                         metadata={"description": "which search: text (default) or visual"})


class ServingModelSchema(Schema):
    model = fields.String(required=True)
    dims = fields.Integer(allow_none=True)


class ServingFillSchema(ServingModelSchema):
    coverage = fields.Nested(CoverageSchema, required=True)
    batch_id = fields.String(allow_none=True, metadata={"description": "the fill batch (GET /batches/{id})"})
    fill_rounds = fields.Integer()


class ServingEventSchema(Schema):
    action = fields.String(required=True)
    epoch = fields.Integer(required=True)
    from_model = fields.String(allow_none=True)
    to_model = fields.String(allow_none=True)
    at = fields.String(required=True)


class ServingPendingSchema(Schema):
    model = fields.String(required=True)
    dims = fields.Integer(required=True)
    preprocess_version = fields.String(allow_none=True)
    since = fields.String(required=True, metadata={"description": "when the sweeps began to disagree"})


class ServingStateSchema(Schema):
    scope_id = fields.String(required=True)
    kind = fields.String(required=True)
    state = fields.String(required=True, metadata={"description": "serving | backfill | pinned | unset"})
    epoch = fields.Integer(required=True)
    model = fields.String(required=True, metadata={"description": "the model search reads"})
    dims = fields.Integer()
    coverage = fields.Nested(CoverageSchema, allow_none=True,
                             metadata={"description": "images with a context / with a current embedding of it"})
    target = fields.Nested(ServingFillSchema, allow_none=True)
    previous = fields.Nested(ServingModelSchema, allow_none=True, metadata={"description": "the rollback target"})
    started_at = fields.String(allow_none=True)
    switched_at = fields.String(allow_none=True)
    pending_change = fields.Nested(ServingPendingSchema, allow_none=True, metadata={
        "description": "a configured model the sweeps disagree towards, not acted on yet: the change "
                       "begins once no sweep agreed with the current direction for MEMEFLOW_SEARCH_CONFIG_GRACE_S"})
    events = fields.List(fields.Nested(ServingEventSchema))


# --- health ---------------------------------------------------------------------------------

class HealthSchema(Schema):
    status = fields.String(required=True)


class ReadySchema(Schema):
    status = fields.String(required=True)  # ready | degraded (still 200) | not_ready (503)
    checks = fields.Dict(keys=fields.String(), values=fields.Dict())
    reasons = fields.List(fields.Dict())  # why degraded: [{code, message}]


# --- events and webhooks (issue 20) ---------------------------------------------------------------

MAX_EVENT_ID = 2**63 - 1
_EVENT_ID_DIGITS = len(str(MAX_EVENT_ID))


def is_event_id_text(raw: str) -> bool:
    """Whether ``raw`` spells an event id as the contract says: ASCII digits only (no sign, space,
    ``_`` or other script's digits, which ``int()`` all accepts), at most ``MAX_EVENT_ID``."""
    return raw.isascii() and raw.isdigit() and len(raw) <= _EVENT_ID_DIGITS and int(raw) <= MAX_EVENT_ID


class EventId(fields.Integer):
    """An event id cursor: a non-negative integer in ASCII digits, at most ``MAX_EVENT_ID``."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str) and not is_event_id_text(value):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class EventsArgsSchema(StrictSchema):
    after = EventId(load_default=None, validate=validate.Range(min=0, max=MAX_EVENT_ID),
                           metadata={"description": "return events with a larger id (default 0; SSE: or "
                                                    "the Last-Event-ID header)"})
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=100))
    wait = fields.Float(load_default=0.0, validate=validate.Range(min=0, max=300),
                        metadata={"description": "long-poll: seconds to wait for a first event "
                                                 "(capped by MEMEFLOW_EVENT_MAX_WAIT_S)"})


class EventSchema(Schema):
    id = fields.Integer(required=True)
    type = fields.String(required=True)
    scope_id = fields.String(required=True)
    job_id = fields.String(allow_none=True)
    image_id = fields.String(allow_none=True)
    batch_id = fields.String(allow_none=True)
    payload = fields.Dict(required=True)
    created_at = fields.String(required=True)


class EventsExpiredSchema(Schema):
    code = fields.String(required=True, metadata={"description": "events_expired"})
    after = fields.Integer(required=True, metadata={"description": "the cursor read from"})
    through = fields.Integer(required=True,
                             metadata={"description": "retention deleted this scope's events up to this id"})
    message = fields.String(required=True)


class EventPageSchema(Schema):
    events = fields.List(fields.Nested(EventSchema), required=True)
    last_id = fields.Integer(required=True)
    expired = fields.Nested(EventsExpiredSchema, allow_none=True, required=True, metadata={
        "description": "null, or: retention deleted events after `after` before this read — some may be missing"})


class WebhookCreateSchema(StrictSchema):
    url = fields.String(required=True, validate=validate.Length(min=1, max=100_000))
    event_types = BoundedList(fields.String(validate=validate.Length(max=64)), max_items=32, load_default=None,
                              validate=validate.Length(max=32),
                              metadata={"description": "event types to deliver (default: all)"})


class WebhookSchema(Schema):
    id = fields.String(required=True)
    url = fields.String(required=True)
    event_types = fields.List(fields.String(), required=True)
    created_at = fields.String(required=True)
    cursor = fields.Integer(required=True)
    delivered_count = fields.Integer(required=True)
    failed_count = fields.Integer(required=True)
    last_error = fields.Dict(allow_none=True)
    last_delivery_at = fields.String(allow_none=True)
    next_attempt_at = fields.String(allow_none=True)
    attempts = fields.Integer(required=True)


class WebhookCreatedSchema(Schema):
    webhook = fields.Nested(WebhookSchema, required=True)
    secret = fields.String(required=True, metadata={"description": "shown once: sign-check deliveries with it"})


class WebhookListSchema(Schema):
    items = fields.List(fields.Nested(WebhookSchema), required=True)
