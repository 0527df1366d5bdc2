"""Where the broker is, without ever starting anything.

A worker, beat or Flower process must not start the embedded servers as a side effect of being
imported: it uses ``MEMEFLOW_BROKER_URL``, else the embedded Redis if it runs, else the port the
embedded Redis last used (Celery keeps retrying until it comes up).
"""

from __future__ import annotations

import json
import logging

from app.config import Settings
from app.embedded import EmbeddedServiceError
from app.runtime import embedded_services, resolve_urls

log = logging.getLogger(__name__)
FALLBACK_BROKER_URL = "redis://127.0.0.1:6379/0"


def broker_url_for(settings: Settings) -> str:
    """The broker URL for ``settings``; never starts an embedded server."""
    if settings.broker_url:
        return settings.broker_url
    try:
        return resolve_urls(settings, start=False).broker_url
    except EmbeddedServiceError:
        pass
    services = embedded_services(settings)
    try:
        state = json.loads((services.run_dir / "redis.json").read_text())
        url = f"redis://127.0.0.1:{int(state['port'])}/0"
    except (OSError, ValueError, KeyError):
        url = FALLBACK_BROKER_URL
    log.warning("broker not running yet; will keep retrying %s", url)
    return url


def database_url_for(settings: Settings) -> str:
    """The database URL for ``settings``; the embedded PostgreSQL must already run."""
    if settings.database_url:
        return settings.database_url
    return resolve_urls(settings, start=False).database_url
