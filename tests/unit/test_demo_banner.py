"""``memeflow demo`` ends with the library page's URL and says whether it stays open (--keep)."""

from __future__ import annotations

from app.cli.demo import library_banner
from app.cli.stack import Stack
from app.config import Settings


def test_the_stack_serves_the_library_at_the_api_root(tmp_path):
    settings = Settings(var_dir=tmp_path, api_host="127.0.0.1", api_port=5123)
    urls = Stack(settings).urls()
    assert urls["library"] == "http://127.0.0.1:5123/" and urls["ops"] == "http://127.0.0.1:5123/ops"


def test_the_banner_names_the_library_and_what_keep_does():
    urls = {"library": "http://127.0.0.1:5000/"}
    kept = library_banner(urls, keep=True)
    assert kept[0].startswith("Library http://127.0.0.1:5000/") and "Ctrl-C" in kept[-1]
    stopped = library_banner(urls, keep=False)
    assert "--keep" in stopped[-1]
    assert "sign in" in library_banner(urls, keep=True, auth="token")[0]


def test_the_urls_memeflow_up_prints_carry_no_password(tmp_path):
    """``memeflow up`` echoes every URL of ``Stack.urls()``; with MEMEFLOW_DATABASE_URL and
    MEMEFLOW_BROKER_URL carrying credentials it printed both passwords to the terminal."""
    stack = Stack(Settings(var_dir=tmp_path))
    stack.database_url = "postgresql+psycopg://memeflow:pg-s3cret@db.internal:5432/memeflow"
    stack.broker_url = "redis://:redis-s3cret@cache.internal:6379/0"
    urls = stack.urls()
    assert "s3cret" not in " ".join(urls.values()), urls
    assert urls["postgres"] == "postgresql+psycopg://memeflow:***@db.internal:5432/memeflow"
    assert urls["redis"] == "redis://:***@cache.internal:6379/0"
    stack.database_url = "postgresql+psycopg://postgres@/memeflow?host=/var/run"
    assert stack.urls()["postgres"] == "postgresql+psycopg://postgres@/memeflow?host=/var/run"
