"""WSGI entry point (``gunicorn app.api.wsgi:app``, ``flask --app app.api.wsgi run``).

The scope resolver is chosen by ``MEMEFLOW_AUTH``: ``none`` → scope ``local``; ``token`` →
bearer tokens looked up in ``api_tokens``.
"""

from __future__ import annotations

from app.api import create_app
from app.auth import resolver_for
from app.config import get_settings
from app.db.engine import make_engine


def build_app():
    """The API wired from the environment (embedded service URLs resolved if unset)."""
    settings = get_settings()
    if settings.database_url is None or settings.broker_url is None:
        from app.runtime import resolve_urls

        urls = resolve_urls(settings, start=False)
        settings = settings.replace(database_url=urls.database_url, broker_url=urls.broker_url)
    engine = make_engine(settings.database_url)
    return create_app(scope_resolver=resolver_for(settings, engine), settings=settings, engine=engine)


app = build_app()
