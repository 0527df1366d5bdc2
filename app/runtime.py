"""Where the database and broker are: explicit URLs from settings, else the embedded servers."""

from __future__ import annotations

from app.config import Settings
from app.embedded import EmbeddedServiceError, EmbeddedServices, ServiceUrls


def embedded_services(settings: Settings) -> EmbeddedServices:
    return EmbeddedServices(settings.var_dir)


def resolve_urls(settings: Settings, *, start: bool = False) -> ServiceUrls:
    """The URLs to use. With both MEMEFLOW_*_URL set nothing embedded is touched.

    Without them, the embedded servers under ``var_dir`` are used; ``start=True`` starts them if
    needed (``memeflow up``/``demo``), otherwise they must already be running.
    """
    if settings.database_url and settings.broker_url:
        return ServiceUrls(settings.database_url, settings.broker_url)
    services = embedded_services(settings)
    urls = services.start() if start else services.urls()
    if urls is None:
        raise EmbeddedServiceError(
            f"embedded services under {settings.var_dir} are not running: start them with `memeflow up` "
            "or set MEMEFLOW_DATABASE_URL and MEMEFLOW_BROKER_URL"
        )
    return ServiceUrls(settings.database_url or urls.database_url, settings.broker_url or urls.broker_url)
