"""Which text model answers a scope's search (app/orchestrator/serving.py keeps the state).

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
    info: dict[str, Any] = {
        "state": row["state"], "epoch": int(row["epoch"]), "model": row["serving_model"],
        "target": ({"model": row["target_model"], "coverage": {"ready": row["ready"], "total": row["total"]}}
                   if row["target_model"] else None),
        "switched_at": row["switched_at"].isoformat() if row["switched_at"] else None,
    }
    if (row["serving_model"], row["serving_dims"]) == (str(cfg["model"]), int(cfg["dims"])):
        return TextSource(configured, info)
    from app.worker.providers import Providers

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
