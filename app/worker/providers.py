"""Moved to :mod:`app.stages.providers` (providers live below the orchestrator). This re-export
keeps ``app/worker/executor.py``'s import working until the branches are merged; new code imports
``app.stages.providers``."""

from app.stages.providers import Providers, agent_options, text_options, visual_options

__all__ = ["Providers", "agent_options", "text_options", "visual_options"]
