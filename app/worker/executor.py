"""Turn a claim into an artifact: load the image, call the lane's provider (pure compute).

No state is decided here: the executor reads the stored file (and, for text, the context the
document is rendered from) and returns an artifact or raises a typed StageError.

A batch of claims is one provider call, but every claim keeps its own outcome: a bad input
fails alone, a provider may answer one item with an exception, and a call that raises is
bisected until each failure belongs to the one item that fails alone (``embed_isolated``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from app.config import Settings
from app.db.enums import Lane
from app.orchestrator.fingerprints import config_hash, semantic_document
from app.orchestrator.types import AgentArtifact, Claim, TextArtifact, VisualArtifact
from app.stages.agent.context_text import checked_agent_context, storable_name
from app.stages.errors import PermanentError, ProviderConfigMismatch, RetryableError, StageError
from app.stages.images import DecodedImage, decode_image
from app.stages.providers import Providers
from app.stages.vectors import NOT_COMPARABLE, NOT_STORABLE, vector_problem
from app.storage import ContentMismatch, FileStore, InvalidStorageKey
from app.worker import watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")


INTERNAL_ERROR_MESSAGE = "the stage failed unexpectedly; the worker's log has the details"


def as_stage_error(exc: BaseException) -> StageError:
    """A provider's own StageError as is; anything else (a bug, an out-of-memory) is retryable,
    but never as "provably not executed". Its text goes to the log only: the error stored on the
    task is shown to the tenant, and an exception's text may carry internal paths or hosts."""
    if isinstance(exc, StageError):
        return exc
    log.warning("unexpected %s in a stage: %s", type(exc).__name__, exc, exc_info=exc)
    return RetryableError(INTERNAL_ERROR_MESSAGE, code="internal_error", not_executed=False)


def embed_isolated(embed: Callable[[list[T]], Sequence[Any]], items: list[T], lane: str) -> list[Any]:
    """``embed(items)`` with one outcome per item: its vector or its own StageError.

    A provider may answer an item with an exception in place of its vector (that item fails). A
    call that raises is split in halves and each half run again, down to single items, so an
    error is only ever charged to an item whose call failed with that item alone — never copied
    onto the others of the batch (which may belong to other scopes). One poisoned item among n
    costs about 2·log2(n) extra calls; a provider that fails for everything, 2n − 1 calls in all.
    """
    try:
        with watchdog.provider_call(lane, embed):  # a call that never returns ends the worker
            vectors = list(embed(items))
        if len(vectors) != len(items):
            raise RuntimeError(f"the provider returned {len(vectors)} vectors for {len(items)} inputs")
    except Exception as exc:  # noqa: BLE001 - bisected below; a single item's failure is its own
        if len(items) == 1:
            return [as_stage_error(exc)]
        log.warning("a provider call for %d items failed; running its halves again", len(items),
                    extra={"lane": lane, "code": type(exc).__name__})
        mid = len(items) // 2
        return embed_isolated(embed, items[:mid], lane) + embed_isolated(embed, items[mid:], lane)
    return [as_stage_error(v) if isinstance(v, BaseException) else v for v in vectors]


def checked_vector(vector: Any, dims: int) -> list[float] | StageError:
    """A provider's vector for one item as floats, or the PermanentError that fails that item
    alone: a vector pgvector refuses (NaN, infinite, beyond float4, not ``dims`` long) would
    otherwise abort the completion transaction of its whole batch (SPEC §10), and one it stores
    but cannot compare (no float4 norm: all zeros) would rank and score every search with NaN."""
    if isinstance(vector, StageError):
        return vector
    values, problem = vector_problem(vector, dims)
    if problem == NOT_STORABLE:
        return PermanentError(f"the provider returned an invalid vector (not {dims} finite numbers)",
                              code="provider_bad_output")
    if problem == NOT_COMPARABLE:
        return PermanentError("the provider returned a vector without a usable length (all zeros, or "
                              "elements too small or too large for a cosine)", code="provider_bad_output")
    assert values is not None
    return values


def load_image(settings: Settings, claim: Claim) -> DecodedImage:
    """The claimed image's stored file, decoded — only once its bytes are proven to be the content
    its key names (``FileStore.read_verified``), so no artifact is ever computed from other bytes
    and written for the image's sha256.

    A missing file is retryable: a content replace or revert racing this task may have removed it
    a moment ago and put it back (each claim reads the image's current key), and nothing was called
    yet, so a paid stage may retry too; one that stays missing fails ``file_missing`` once the
    attempts are spent. A file that cannot be read (permission denied, a directory or a FIFO in
    its place, an I/O error) is retried the same way and ends ``file_unreadable``: an operator's
    fix makes it readable again. Bytes that do not match the key's sha256 (truncated, replaced)
    fail at once, ``file_corrupt``: reading them again gives the same wrong bytes — restore the
    file, then retry the job."""
    key = claim.storage_key
    try:
        data = FileStore(settings.storage_path).read_verified(key)
    except FileNotFoundError:
        raise RetryableError(f"stored file {key} is missing", code="file_missing",
                             not_executed=True, exhausted_code="file_missing") from None
    except (ContentMismatch, InvalidStorageKey) as exc:
        log.warning("stored file refused: %s", exc, extra={"task_id": claim.task_id, "code": "file_corrupt"})
        raise PermanentError(f"stored file {key} does not hold the image's content", code="file_corrupt") from None
    except OSError as exc:  # the text stays in the log: it may name the storage's paths
        log.warning("stored file unreadable: %s", exc, extra={"task_id": claim.task_id, "code": "file_unreadable"})
        raise RetryableError(f"stored file {key} cannot be read ({type(exc).__name__})", code="file_unreadable",
                             not_executed=True, exhausted_code="file_unreadable") from None
    return decode_image(data, max_pixels=settings.max_image_pixels)


def check_config(claim: Claim, provider, known: tuple[dict, str] | None = None) -> dict:
    """The worker's provider must be the one the job was planned with, or the artifact is useless.
    ``known``: the provider's (config, config hash) already computed for this batch. Checked before
    any call (a paid one included), so a mismatch proves nothing ran: the orchestrator replans the
    job under this process's configuration (``app.orchestrator.replan``) rather than failing it."""
    cfg, cfg_hash = known if known is not None else (provider.config(), None)
    expected = claim.payload.get("stage_config_hash")
    if expected and (cfg_hash or config_hash(cfg)) != expected:
        raise ProviderConfigMismatch(
            f"this worker's {claim.stage} provider ({cfg.get('model')}) differs from the job's configuration")
    return cfg


def execute_visual(settings: Settings, providers: Providers, claim: Claim) -> VisualArtifact:
    result = execute_visual_batch(settings, providers, [claim])[0]
    if isinstance(result, StageError):
        raise result
    return result


def execute_visual_batch(
    settings: Settings, providers: Providers, claims: list[Claim], orch: Any = None,
) -> list[VisualArtifact | StageError]:
    """One provider call for every claim whose image decodes (aligned with ``claims``); a claim's
    own bad input, and an item the provider fails on, is that claim's failure alone."""
    out: list[VisualArtifact | StageError | None] = [None] * len(claims)
    todo: list[tuple[int, DecodedImage]] = []
    cfg = providers.visual.config()
    known = (cfg, config_hash(cfg))  # once per batch, not per claim
    for i, claim in enumerate(claims):
        try:
            check_config(claim, providers.visual, known)
            todo.append((i, load_image(settings, claim)))
        except StageError as exc:
            out[i] = exc
    if todo:
        dims = int(cfg["dims"])
        vectors = embed_isolated(providers.visual.embed, [img for _, img in todo], "visual")
        for (i, _), vector in zip(todo, vectors, strict=True):
            checked = checked_vector(vector, dims)
            out[i] = checked if isinstance(checked, StageError) else VisualArtifact(
                checked, cfg["model"], cfg["preprocess_version"], dims)
        if orch is not None:
            extras = orch.visual_extra_models([claims[i] for i, _ in todo])
            if extras:
                _embed_extra_visual(providers, claims, dict(todo), extras, cfg, out)
    return out  # type: ignore[return-value]


def _embed_extra_visual(providers: Providers, claims: list[Claim], images: dict[int, DecodedImage],
                        extras: dict, cfg: dict, out: list) -> None:
    """During a visual model change, each image is also embedded with the other models its scope's
    serving state needs (as ``_embed_extra_models`` for text; the decoded image is reused)."""
    own = (cfg["model"], int(cfg["dims"]), cfg["preprocess_version"])
    by_model: dict[tuple, tuple[dict, list[int]]] = {}
    for i in images:
        if not isinstance(out[i], VisualArtifact):
            continue
        for ref in extras.get(claims[i].image_id, []):
            key = (ref["model"], int(ref["dims"]), ref.get("preprocess_version"))
            if key != own:
                by_model.setdefault(key, (ref, []))[1].append(i)
    for key, (ref, indexes) in by_model.items():
        provider = _extra_provider(lambda r=ref: providers.visual_for(r), key,
                                   lambda got: (str(got["model"]), int(got["dims"]), str(got["preprocess_version"])))
        if isinstance(provider, StageError):
            for i in indexes:
                out[i] = provider
            continue
        vectors = embed_isolated(provider.embed, [images[i] for i in indexes], "visual")
        for i, v in zip(indexes, vectors, strict=True):
            current, checked = out[i], checked_vector(v, key[1])
            if isinstance(checked, StageError):
                out[i] = checked
            elif isinstance(current, VisualArtifact):
                extra = VisualArtifact(checked, key[0], str(key[2]), key[1])
                out[i] = dataclasses.replace(current, extra=(*current.extra, extra))


def _extra_provider(build, key: tuple, identity) -> Any:
    """The provider of a serving/target model ref, or the StageError that fails its claims: a model
    this worker cannot build, or one whose spec now builds another model."""
    try:
        provider = build()
        got = identity(provider.config())
    except StageError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a model that cannot load fails these claims, not the batch
        log.warning("cannot build the serving model %s: %s", key[0], exc)
        return PermanentError(f"the search's serving model {key[0]!r} cannot be built in this worker",
                              code="serving_model_unavailable")
    if got != key:
        return PermanentError(f"the provider for {key[0]!r} now builds {got[0]!r}", code="serving_model_unavailable")
    return provider


def execute_agent(settings: Settings, providers: Providers, claim: Claim) -> AgentArtifact:
    """A fresh paid call under this claim's attempt id (the attempt row is already committed)."""
    check_config(claim, providers.agent)
    assert claim.attempt_id and not claim.recovering
    image = load_image(settings, claim)
    with watchdog.provider_call(Lane.AGENT.value, providers.agent):
        result = providers.agent.describe(
            image, attempt_id=claim.attempt_id, reverse_image_policy=claim.payload["reverse_image_policy"]
        )
    return _agent_artifact(providers, result, claim.attempt_id)


def _agent_artifact(providers: Providers, result, attempt_id: str) -> AgentArtifact:
    """Whatever agent answered: its context as a PATCH may store it, or this claim's own
    agent_bad_output; its model and request id only when fit to store (else the configured model
    and none: provenance never fails a paid answer)."""
    model = storable_name(result.model) or storable_name(providers.agent.config().get("model")) or "unknown"
    return AgentArtifact(checked_agent_context(result.context), model, attempt_id, storable_name(result.request_id))


def recover_agent(settings: Settings, providers: Providers, claim: Claim) -> AgentArtifact | None:
    """Ask the provider what an interrupted attempt did; None = it cannot be proven (no re-call)."""
    assert claim.attempt_id and claim.recovering
    with watchdog.provider_call(Lane.AGENT.value, providers.agent):
        found = providers.agent.lookup(claim.attempt_id)
    if found.status != "complete" or found.result is None:
        return None
    return _agent_artifact(providers, found.result, claim.attempt_id)


def text_document(inputs: dict | None, cfg: dict) -> tuple[str, str]:
    """(document, metadata_hash) from the image's current context."""
    if inputs is None:
        raise PermanentError("the image is gone", code="target_changed")
    doc = semantic_document(inputs["display_name"], inputs["context"], cfg.get("document_version", "1"))
    return doc, inputs["metadata_hash"] or ""


def execute_text_batch(
    orch, settings: Settings, providers: Providers, claims: list[Claim]
) -> list[TextArtifact | StageError]:
    """One model call for every claim whose document renders (aligned with ``claims``); the
    inputs of all of them are read in one query. An item the model fails on fails alone."""
    cfg = providers.text.config()
    known = (cfg, config_hash(cfg))  # once per batch, not per claim
    inputs = orch.text_inputs_many(claims)
    out: list[TextArtifact | StageError | None] = [None] * len(claims)
    todo: list[tuple[int, str, str]] = []
    for i, claim in enumerate(claims):
        try:
            check_config(claim, providers.text, known)
            doc, mhash = text_document(inputs.get(claim.image_id), cfg)
            todo.append((i, doc, mhash))
        except StageError as exc:
            out[i] = exc
    if todo:
        dims = int(cfg["dims"])
        vectors = embed_isolated(providers.text.embed, [doc for _, doc, _ in todo], "embedding")
        for (i, doc, mhash), v in zip(todo, vectors, strict=True):
            checked = checked_vector(v, dims)
            out[i] = checked if isinstance(checked, StageError) else TextArtifact(
                checked, cfg["model"], dims, doc, str(cfg.get("document_version", "1")), mhash)
        _embed_extra_models(providers, claims, inputs, cfg, out)
    return out  # type: ignore[return-value]


def _embed_extra_models(providers: Providers, claims: list[Claim], inputs: dict, cfg: dict, out: list) -> None:
    """During a model change, each document is also embedded with the other models its scope's
    search serving state needs (``extra_models``: the serving and target models); one call per
    model. A claim whose extra model cannot be built or fails is that claim's failure (the stage
    is valid only with every model's row, so skipping it would only plan the same task again)."""
    own = (cfg["model"], int(cfg["dims"]))
    by_model: dict[tuple[str, int], tuple[dict, list[int]]] = {}
    for i, claim in enumerate(claims):
        if not isinstance(out[i], TextArtifact):
            continue
        for ref in (inputs.get(claim.image_id) or {}).get("extra_models", []):
            key = (ref["model"], int(ref["dims"]))
            if key != own:
                by_model.setdefault(key, (ref, []))[1].append(i)
    for (model, dims), (ref, indexes) in by_model.items():
        provider = _extra_provider(lambda r=ref: providers.text_for(r), (model, dims),
                                   lambda got: (str(got["model"]), int(got["dims"])))
        if isinstance(provider, StageError):
            for i in indexes:
                out[i] = provider
            continue
        version = str(provider.config().get("document_version", "1"))
        docs = []
        for i in indexes:
            info = inputs[claims[i].image_id]
            docs.append(semantic_document(info["display_name"], info["context"], version))
        vectors = embed_isolated(provider.embed, docs, "embedding")
        for i, doc, v in zip(indexes, docs, vectors, strict=True):
            current, checked = out[i], checked_vector(v, dims)
            if isinstance(checked, StageError):
                out[i] = checked
            elif isinstance(current, TextArtifact):
                extra = TextArtifact(checked, model, dims, doc, version, current.metadata_hash)
                out[i] = dataclasses.replace(current, extra=(*current.extra, extra))


#: The worker's compute of each non-paid stage, by its provider kind (StageSpec.provider_kind):
#: ``compute(orch, providers, claims)`` → one artifact or StageError per claim, aligned with
#: ``claims``; run.py dispatches a lane's claims here. The paid agent call has its own path
#: (execute_agent / recover_agent: the attempt protocol).
BATCH_COMPUTE: dict[str, Callable[[Any, Providers, list[Claim]], list]] = {
    "visual": lambda orch, providers, claims: execute_visual_batch(orch.settings, providers, claims, orch),
    "text": lambda orch, providers, claims: execute_text_batch(orch, orch.settings, providers, claims),
}
