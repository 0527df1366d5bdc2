"""One tenant's burst of searches cannot take an API process's threads from the others: at most
``searches_per_scope`` searches of a scope run at once in a process (text and look-alike alike),
over it 429 ``too_many_searches`` with ``Retry-After`` — while another scope's search is served."""

from __future__ import annotations

import io
import threading

import pytest

from app.api import create_app
from app.auth import TokenScopeResolver
from app.search import service as text_search
from tests.api.conftest import png_bytes


@pytest.fixture()
def capped(settings, engine, orch, publisher, store):
    return create_app(
        scope_resolver=TokenScopeResolver(engine), settings=settings.replace(searches_per_scope=2),
        orchestrator=orch, engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret",
    )


def test_a_scope_runs_at_most_its_searches_at_once_and_others_are_served(capped, tokens, monkeypatch):
    client = capped.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    beta = {"Authorization": f"Bearer {tokens['beta']}"}
    release, inside = threading.Event(), threading.Semaphore(0)
    real = text_search.search_text

    def slow_for_alpha(engine, provider, scope, *args, **kwargs):
        if scope == "alpha":
            inside.release()
            assert release.wait(60)
        return real(engine, provider, scope, *args, **kwargs)

    monkeypatch.setattr(text_search, "search_text", slow_for_alpha)
    answers: list[int] = []
    held = [threading.Thread(target=lambda: answers.append(
        client.get("/api/v1/search/text?q=cat", headers=alpha).status_code)) for _ in range(2)]
    for t in held:
        t.start()
    try:
        for _ in held:  # both of alpha's slots are taken, their searches in progress
            assert inside.acquire(timeout=30)
        over = client.get("/api/v1/search/text?q=cat", headers=alpha)
        assert over.status_code == 429 and over.get_json()["error"] == "too_many_searches"
        assert over.headers["Retry-After"] == "1"
        looks = client.post("/api/v1/search/visual", headers=alpha, content_type="multipart/form-data",
                            data={"file": (io.BytesIO(png_bytes()), "q.png")})
        assert looks.status_code == 429  # the look-alike search counts in the same slots
        assert client.get("/api/v1/search/text?q=cat", headers=beta).status_code == 200  # another tenant's: served
    finally:
        release.set()
        for t in held:
            t.join(60)
    assert answers == [200, 200]
    assert capped.extensions["memeflow"].searches.held() == 0  # every slot given back
    assert client.get("/api/v1/search/text?q=cat", headers=alpha).status_code == 200


def test_a_failing_search_gives_its_slot_back(capped, tokens):
    client = capped.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    for _ in range(3):  # more than the cap: each 422 released its slot
        resp = client.get("/api/v1/search/text?q=cat&model=nope", headers=alpha)
        assert resp.status_code == 422
    assert capped.extensions["memeflow"].searches.held() == 0


class _Trickle(io.BytesIO):
    """A request body whose client is slow: the first read waits until the test lets it go."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reading, self.go = threading.Event(), threading.Event()

    def _arriving(self) -> None:
        if not self.reading.is_set():
            self.reading.set()
            assert self.go.wait(60)

    def read(self, size: int | None = -1) -> bytes:
        self._arriving()
        return super().read(size)

    def read1(self, size: int = -1) -> bytes:
        self._arriving()
        return super().read1(size)

    def readinto(self, buffer) -> int:
        self._arriving()
        return super().readinto(buffer)

    def readline(self, size: int | None = -1) -> bytes:
        self._arriving()
        return super().readline(size)


def test_a_look_alike_upload_still_arriving_holds_no_search_share(capped, tokens):
    """A search share is for the search's work (embedding, ranking, decodes), not for a slow
    client's upload: with the process's searches fairly capped (MEMEFLOW_SEARCHES_PER_PROCESS), a
    few trickling uploads held every share and every tenant's searches were refused meanwhile."""
    client = capped.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    boundary = "memeflowboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"q.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + png_bytes() + f"\r\n--{boundary}--\r\n".encode()
    trickle = _Trickle(body)
    answers: list[int] = []
    search = threading.Thread(target=lambda: answers.append(client.post(
        "/api/v1/search/visual", headers=alpha, input_stream=trickle, content_length=len(body),
        content_type=f"multipart/form-data; boundary={boundary}").status_code))
    search.start()
    try:
        assert trickle.reading.wait(30)  # the view is reading the body: the client is still sending it
        assert capped.extensions["memeflow"].searches.held() == 0
    finally:
        trickle.go.set()
        search.join(60)
    assert answers == [200]
    assert capped.extensions["memeflow"].searches.held() == 0
