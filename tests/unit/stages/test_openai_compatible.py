"""openai-compatible agent against a real local HTTP server (chat-completions protocol)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from app.stages.agent.openai_compatible import OpenAICompatibleAgent
from app.stages.errors import OutcomeUnknownError, PermanentError, RetryableError

from .helpers import decoded

GOOD_CONTEXT = {
    "title": "Sleepy cat",
    "description": "A cat asleep on a keyboard.",
    "ocr_text": "MONDAY AGAIN",
    "tags": ["Cat", "monday", "cat"],
}


def completion(content: str) -> dict:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "model": "served-model-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }


class FakeServer:
    """Chat-completions server; the first path segment selects its behaviour."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: object, headers: dict | None = None) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                length = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(length))
                mode = self.path.split("/")[1]
                fake.requests.append({"mode": mode, "headers": dict(self.headers), "body": body})
                if mode == "good":
                    self._send(200, completion(json.dumps(GOOD_CONTEXT)), {"x-request-id": "req-9"})
                elif mode == "fenced":
                    self._send(200, completion("```json\n" + json.dumps(GOOD_CONTEXT) + "\n```"))
                elif mode == "malformed":
                    self._send(200, completion('{"title": "cut off'))
                elif mode == "wrongtypes":
                    self._send(200, completion(json.dumps({**GOOD_CONTEXT, "tags": "cat"})))
                elif mode == "ratelimited":
                    self._send(429, {"error": "slow down"}, {"Retry-After": "7"})
                elif mode == "servererror":
                    self._send(500, {"error": "boom"})
                elif mode == "badrequest":
                    self._send(400, {"error": "bad image"})
                elif mode == "slow":
                    fake.release.wait(10)  # released at teardown; the client gives up first
                    self._send(200, completion(json.dumps(GOOD_CONTEXT)))

            def do_GET(self):
                # /lookup/<attempt_id>: complete if we received that attempt, else 404.
                parts = self.path.split("/")
                if parts[1] == "lookup-broken":
                    self._send(503, {"error": "down"})
                    return
                seen = {
                    r["headers"].get("Idempotency-Key")
                    for r in fake.requests
                    if r["mode"] == "good"
                }
                if parts[2] in seen:
                    self._send(200, completion(json.dumps(GOOD_CONTEXT)))
                else:
                    self._send(404, {"error": "unknown attempt"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def agent(self, mode: str, **options) -> OpenAICompatibleAgent:
        options.setdefault("timeout_s", 5)
        return OpenAICompatibleAgent(base_url=f"{self.url}/{mode}/v1", model="test-vlm", **options)


@pytest.fixture(scope="module")
def server():
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.release.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()


@pytest.fixture(scope="module")
def image():
    return decoded(Image.new("RGB", (64, 48), (200, 30, 30)))


def _describe(agent, image, attempt_id=None):
    return agent.describe(
        image, attempt_id=attempt_id or uuid.uuid4().hex, reverse_image_policy="forbid"
    )


def test_good_answer_is_parsed_and_request_is_well_formed(server, image):
    attempt_id = uuid.uuid4().hex
    result = _describe(server.agent("good", api_key="sk-test"), image, attempt_id)
    assert result.context == {
        "title": "Sleepy cat",
        "description": "A cat asleep on a keyboard.",
        "ocr_text": "MONDAY AGAIN",
        "tags": ["cat", "monday"],
        "facts": {"width": 64, "height": 48, "dominant_colors": ["#c81e1e"], "animated": False},
    }
    assert result.model == "served-model-1" and result.request_id == "req-9"
    sent = server.requests[-1]
    assert sent["headers"]["Idempotency-Key"] == attempt_id
    assert sent["headers"]["Authorization"] == "Bearer sk-test"
    assert sent["body"]["model"] == "test-vlm"
    image_part = sent["body"]["messages"][1]["content"][1]
    assert image_part["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_no_authorization_header_without_api_key(server, image):
    _describe(server.agent("good"), image)
    assert "Authorization" not in server.requests[-1]["headers"]


def test_fenced_json_answer_is_accepted(server, image):
    assert _describe(server.agent("fenced"), image).context["title"] == "Sleepy cat"


@pytest.mark.parametrize("mode", ["malformed", "wrongtypes"])
def test_bad_answer_is_permanent_agent_bad_output(server, image, mode):
    with pytest.raises(PermanentError) as info:
        _describe(server.agent(mode), image)
    assert info.value.code == "agent_bad_output"


def test_429_is_retryable_and_not_executed(server, image):
    with pytest.raises(RetryableError) as info:
        _describe(server.agent("ratelimited"), image)
    assert info.value.code == "agent_rate_limited"
    assert info.value.not_executed is True
    assert info.value.retry_after_s == 7.0


def test_500_is_retryable_but_not_provably_unexecuted(server, image):
    with pytest.raises(RetryableError) as info:
        _describe(server.agent("servererror"), image)
    assert info.value.code == "agent_server_error"
    assert info.value.not_executed is False


def test_other_4xx_is_permanent(server, image):
    with pytest.raises(PermanentError) as info:
        _describe(server.agent("badrequest"), image)
    assert info.value.code == "agent_request_rejected"


def test_connection_refused_is_retryable_and_provably_not_executed(image):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = OpenAICompatibleAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2)
    with pytest.raises(RetryableError) as info:
        _describe(agent, image)
    assert info.value.not_executed is True
    assert info.value.code == "agent_unreachable"


def test_timeout_after_send_is_outcome_unknown(server, image):
    attempt_id = uuid.uuid4().hex
    with pytest.raises(OutcomeUnknownError) as info:
        _describe(server.agent("slow", timeout_s=0.5), image, attempt_id)
    assert info.value.code == "agent_outcome_unknown"
    assert not isinstance(info.value, RetryableError)
    # The server did receive it: exactly why a retry could double-bill.
    assert any(r["headers"]["Idempotency-Key"] == attempt_id for r in server.requests)


def test_lookup_complete_not_received_and_unknown(server, image):
    attempt_id = uuid.uuid4().hex
    agent = server.agent("good", lookup_url=f"{server.url}/lookup/{{attempt_id}}")
    assert agent.lookup(attempt_id).status == "not_received"
    _describe(agent, image, attempt_id)
    found = agent.lookup(attempt_id, image=image)
    assert found.status == "complete"
    assert found.result.context["title"] == "Sleepy cat"
    assert found.result.context["facts"]["width"] == 64
    assert agent.lookup(attempt_id).result.context["facts"] == {}

    broken = server.agent("good", lookup_url=f"{server.url}/lookup-broken/{{attempt_id}}")
    assert broken.lookup(attempt_id).status == "unknown"
    assert server.agent("good").lookup(attempt_id).status == "unknown"  # no lookup_url


def test_lookup_url_must_have_placeholder(server):
    with pytest.raises(ValueError):
        server.agent("good", lookup_url=f"{server.url}/lookup")
