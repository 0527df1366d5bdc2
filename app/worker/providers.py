"""Stage providers chosen by settings, created once per process and only for the lanes used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.stages import registry


def visual_options(settings: Settings) -> dict[str, Any]:
    if settings.visual_provider == "open_clip":
        return {"checkpoint_path": settings.open_clip_checkpoint, "model_name": settings.open_clip_model}
    return {}


def agent_options(settings: Settings) -> dict[str, Any]:
    opts: dict[str, Any] = {"results_dir": str(settings.agent_results_path)}
    if settings.agent_provider == "openai-compatible":
        opts = {
            "base_url": settings.agent_base_url, "model": settings.agent_model, "api_key": settings.agent_api_key,
            "timeout_s": settings.agent_timeout_s, "lookup_url": settings.agent_lookup_url,
        }
    return opts


def text_options(settings: Settings) -> dict[str, Any]:
    return {}


@dataclass
class Providers:
    """Lazy per-process provider handles; a lane's worker touches only its own provider."""

    settings: Settings
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def visual(self):
        if "visual" not in self._cache:
            self._cache["visual"] = registry.get_visual_provider(
                self.settings.visual_provider, **visual_options(self.settings)
            )
        return self._cache["visual"]

    @property
    def agent(self):
        if "agent" not in self._cache:
            self._cache["agent"] = registry.get_agent_provider(
                self.settings.agent_provider, **agent_options(self.settings)
            )
        return self._cache["agent"]

    @property
    def text(self):
        if "text" not in self._cache:
            self._cache["text"] = registry.get_text_provider(self.settings.text_provider, **text_options(self.settings))
        return self._cache["text"]


def provider_configs(settings: Settings):
    """The configs frozen into new jobs. Providers load their models lazily, so this is cheap."""
    from app.orchestrator.types import StageConfigs

    p = Providers(settings)
    return StageConfigs(visual=p.visual.config(), agent=p.agent.config(), text=p.text.config())
