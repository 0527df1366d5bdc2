"""Which text (and visual) model answers a scope's search (app/orchestrator/serving.py keeps the state).

One query reads one model: the scope's *serving* model, read once per query — during a model
change the previous one, until its scope's cutover. A scope without a serving row yet (before the
sweep's first run) is served by the configured model, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from app.orchestrator.store import serving as q

log = logging.getLogger(__name__)


@dataclass
class TextSource:
    """The provider that embeds this query (the serving model's) and what the response tells about it."""

    provider: Any
    info: dict[str, Any]


def text_source(engine: Engine, scope_id: str, configured: Any, settings: Any) -> TextSource:
    """The scope's serving text model. Its provider is the configured one when they are the same
    model, else built from the stored spec; a serving model this process cannot build falls back to
    the configured one (logged, and visible as ``serving.fallback``) — never an error."""
    cfg = configured.config()
    with engine.connect() as conn:
        row = q.serving_txn(conn, scope_id, "text")
    if row is None:
        return TextSource(configured, {"state": "unset", "epoch": 0, "model": str(cfg["model"]), "target": None,
                                       "switched_at": None})
    info = _info(row)
    if (row["serving_model"], row["serving_dims"]) == (str(cfg["model"]), int(cfg["dims"])):
        return TextSource(configured, info)
    from app.stages.providers import Providers

    try:
        provider = Providers(settings).text_for(row["serving_ref"])
        got = provider.config()
        if (str(got["model"]), int(got["dims"])) != (row["serving_model"], row["serving_dims"]):
            raise ValueError(f"{row['serving_ref']['spec']!r} builds {got['model']!r} now")
    except Exception as exc:  # noqa: BLE001 - search answers from the configured model instead
        log.warning("cannot build the serving text model %s: %s", row["serving_model"], exc,
                    extra={"scope_id": scope_id})
        return TextSource(configured, {**info, "model": str(cfg["model"]), "fallback": True})
    return TextSource(provider, info)


@dataclass
class VisualSource:
    """The visual model that answers a look-alike query of the scope, and what the response tells."""

    provider: Any
    model: str
    preprocess_version: str
    dims: int
    info: dict[str, Any]


def visual_source(engine: Engine, scope_id: str, configured: Any, settings: Any) -> VisualSource:
    """The scope's serving visual model (as :func:`text_source`: configured when it is the same model
    or cannot be built here)."""
    cfg = configured.config()
    mine = (str(cfg["model"]), int(cfg["dims"]), str(cfg["preprocess_version"]))
    with engine.connect() as conn:
        row = q.serving_txn(conn, scope_id, "visual")

    def configured_source(info: dict[str, Any]) -> VisualSource:
        return VisualSource(configured, mine[0], mine[2], mine[1], info)

    if row is None:
        return configured_source({"state": "unset", "epoch": 0, "model": mine[0], "target": None,
                                  "switched_at": None})
    info = _info(row)
    ref = row["serving_ref"]
    served = (row["serving_model"], int(row["serving_dims"]), str(ref.get("preprocess_version")))
    if served == mine:
        return configured_source(info)
    from app.stages.providers import Providers

    try:
        provider = Providers(settings).visual_for(ref)
        got = provider.config()
        if (str(got["model"]), int(got["dims"]), str(got["preprocess_version"])) != served:
            raise ValueError(f"{ref['spec']!r} builds {got['model']!r} now")
    except Exception as exc:  # noqa: BLE001 - search answers from the configured model instead
        log.warning("cannot build the serving visual model %s: %s", served[0], exc, extra={"scope_id": scope_id})
        return configured_source({**info, "model": mine[0], "fallback": True})
    return VisualSource(provider, served[0], served[2], served[1], info)


def _info(row: Any) -> dict[str, Any]:
    return {
        "state": row["state"], "epoch": int(row["epoch"]), "model": row["serving_model"],
        "target": ({"model": row["target_model"], "coverage": {"ready": row["ready"], "total": row["total"]}}
                   if row["target_model"] else None),
        "switched_at": row["switched_at"].isoformat() if row["switched_at"] else None,
    }
