"""openai-compatible agent against a real local HTTP server (chat-completions protocol)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from app.stages.agent.openai_compatible import OpenAICompatibleAgent, parse_context, unfence
from app.stages.errors import OutcomeUnknownError, PermanentError, RetryableError
from tests.conftest import poll_until
from tests.support.poison import POISON_WIDTH

from .helpers import decoded

GOOD_CONTEXT = {
    "title": "Sleepy cat",
    "description": "A cat asleep on a keyboard.",
    "ocr_text": "MONDAY AGAIN",
    "tags": ["Cat", "monday", "cat"],
}


# What a provider might put in an error body: a masked key and an internal host name. It must
# reach the log only, never a task's error (which tenants see).
PROVIDER_SECRET = "Incorrect API key provided: sk-ab***yz; upstream llm-gw-7.internal.corp:8443 failed"
GZIP_BOMB = gzip.compress(b" " * (16 * 1024 * 1024), compresslevel=9)
# an answer whose title holds NUL: valid JSON ("\u0000"), unstorable in PostgreSQL text or jsonb
UNSTORABLE_CONTEXT = {**GOOD_CONTEXT, "title": "Sleepy\x00cat"}


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
        self.huge_bytes_sent = 0
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

            def _drip(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(10**6))
                self.end_headers()
                self._trickle(b" ")

            def _header_drip(self) -> None:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                self._trickle(b"a")

            def _trickle(self, byte: bytes) -> None:
                try:
                    for _ in range(400):  # 20 s at most: far past any deadline the tests set
                        self.wfile.write(byte)
                        self.wfile.flush()
                        if fake.release.wait(0.05):
                            return
                except OSError:
                    pass  # the client gave up: the point of the test

            def _endless(self, chunk: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    for _ in range(16 * 1024):  # 1 GiB at most
                        self.wfile.write(chunk)
                        fake.huge_bytes_sent += len(chunk)
                except OSError:
                    pass

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
                elif mode == "unstorable":
                    self._send(200, completion(json.dumps(UNSTORABLE_CONTEXT)))
                elif mode == "poisoned":  # the unstorable answer for a poisoned image only
                    hostile = _sent_width(body) == POISON_WIDTH
                    self._send(200, completion(json.dumps(UNSTORABLE_CONTEXT if hostile else GOOD_CONTEXT)))
                elif mode == "hostileids":  # a good context under names no column should store
                    self._send(200, {**completion(json.dumps(GOOD_CONTEXT)), "model": "served\x00model",
                                     "id": "\ud800"}, {"x-request-id": "r" * 201})
                elif mode == "wrongtypes":
                    self._send(200, completion(json.dumps({**GOOD_CONTEXT, "tags": "cat"})))
                elif mode == "ratelimited":
                    self._send(429, {"error": "slow down"}, {"Retry-After": "7"})
                elif mode == "servererror":
                    self._send(500, {"error": PROVIDER_SECRET})
                elif mode in ("requesttimeout", "tooearly"):  # 408 / 425: the request was not taken
                    self._send(408 if mode == "requesttimeout" else 425, {"error": "try again"})
                elif mode == "badrequest":
                    self._send(400, {"error": {"message": PROVIDER_SECRET}})
                elif mode == "notjson":
                    self._send(200, f"<html>{PROVIDER_SECRET}</html>".encode())
                elif mode == "drip":  # a valid start, then one byte every 50 ms: no single read waits long
                    self._drip()
                elif mode == "headerdrip":  # a status line, then a header one byte every 50 ms
                    self._header_drip()
                elif mode == "huge":  # an endless answer, in 64 KiB writes, until the client hangs up
                    self._endless(b" " * 65536)
                elif mode == "gzipbomb":  # 16 MiB of spaces in ~16 KiB of gzip
                    self._send(200, GZIP_BOMB, {"Content-Encoding": "gzip"})
                elif mode == "badgzip":  # a complete 200 whose body is not the gzip it claims
                    self._send(200, b"not gzip at all", {"Content-Encoding": "gzip"})
                elif mode == "ratelimitedbadgzip":  # a 429 whose body is not the gzip it claims
                    self._send(429, b"not gzip at all", {"Content-Encoding": "gzip", "Retry-After": "7"})
                elif mode == "gzipchain":  # a complete 200 gzipped 8 times: past urllib3's 5 layers
                    raw = json.dumps(completion(json.dumps(GOOD_CONTEXT))).encode()
                    for _ in range(8):
                        raw = gzip.compress(raw)
                    self._send(200, raw, {"Content-Encoding": ", ".join(["gzip"] * 8)})
                elif mode == "redirect":  # "the model moved": to the good endpoint, re-POSTing the image
                    self._send(307, {"error": "moved"}, {"Location": f"{fake.url}/good/v1/chat/completions"})
                elif mode == "slow":
                    fake.release.wait(10)  # released at teardown; the client gives up first
                    self._send(200, completion(json.dumps(GOOD_CONTEXT)))

            def do_GET(self):
                # /lookup/<attempt_id>: complete if we received that attempt, else 404.
                parts = self.path.split("/")
                if parts[1] == "redirect":
                    self._send(302, {"error": "moved"}, {"Location": f"{fake.url}/lookup/{parts[-1]}"})
                    return
                if parts[1] == "lookup-broken":
                    self._send(503, {"error": "down"})
                    return
                if parts[1] == "headerdrip":
                    self._header_drip()
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


def _sent_width(body: dict) -> int:
    """The width of the image a chat-completions request carries (as a data URL)."""
    url = body["messages"][1]["content"][1]["image_url"]["url"]
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as im:
        return im.width


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


@pytest.mark.parametrize("mode", ["malformed", "wrongtypes", "badgzip", "gzipchain"])
def test_bad_answer_is_permanent_agent_bad_output(server, image, mode):
    """A complete 200 that is not the context — its JSON, or (badgzip, gzipchain) the encoding its
    body claims, undecodable — is the provider's bad answer, not an unknown outcome."""
    with pytest.raises(PermanentError) as info:
        _describe(server.agent(mode), image)
    assert info.value.code == "agent_bad_output"


@pytest.mark.parametrize("field,value", [
    ("title", "a\x00b"), ("description", "\x00"), ("ocr_text", "line\ud800"),
    ("tags", ["ok", "a\x00b"]), ("tags", ["\udfff"]),
])
def test_text_postgresql_cannot_store_is_agent_bad_output(field, value):
    """NUL and lone surrogates (a JSON "\ud800" escape) would abort the completion that stores them."""
    answer = json.dumps({**GOOD_CONTEXT, field: value})
    with pytest.raises(PermanentError) as info:
        parse_context(answer)
    assert info.value.code == "agent_bad_output" and repr(field) in info.value.message


def test_an_unstorable_answer_over_http_is_agent_bad_output(server, image):
    with pytest.raises(PermanentError) as info:
        _describe(server.agent("unstorable"), image)
    assert info.value.code == "agent_bad_output"


def test_unstorable_or_overlong_provider_names_fall_back_to_ours(server, image):
    """The served model, completion id and request id are provenance: one that cannot be stored (or
    runs past 200 characters) is dropped, the paid answer is kept."""
    result = _describe(server.agent("hostileids"), image)
    assert result.context["title"] == "Sleepy cat"
    assert result.model == "test-vlm" and result.request_id is None


def test_429_is_retryable_and_not_executed(server, image):
    with pytest.raises(RetryableError) as info:
        _describe(server.agent("ratelimited"), image)
    assert info.value.code == "agent_rate_limited"
    assert info.value.not_executed is True
    assert info.value.retry_after_s == 7.0


def test_a_429_whose_body_does_not_decode_is_still_a_429(server, image):
    """An error answer's status decides, whatever its body: a 429 with a broken gzip body is rate
    limited (retried after its Retry-After), not an unknown outcome nor a bad answer."""
    with pytest.raises(RetryableError) as info:
        _describe(server.agent("ratelimitedbadgzip"), image)
    assert (info.value.code, info.value.not_executed, info.value.retry_after_s) == ("agent_rate_limited", True, 7.0)


def test_500_is_retryable_but_not_provably_unexecuted(server, image):
    with pytest.raises(RetryableError) as info:
        _describe(server.agent("servererror"), image)
    assert info.value.code == "agent_server_error"
    assert info.value.not_executed is False


@pytest.mark.parametrize("mode", ["requesttimeout", "tooearly"])
def test_408_and_425_are_retryable_and_not_executed(server, image, mode):
    """408 Request Timeout (the server gave up waiting for the request) and 425 Too Early (it will
    not process it yet) say the request was not taken: like a 429, a retry cannot repeat the call.
    They were "other 4xx": permanent, the job failed for a transient refusal."""
    with pytest.raises(RetryableError) as info:
        _describe(server.agent(mode), image)
    assert info.value.code == "agent_request_not_taken"
    assert info.value.not_executed is True


def test_other_4xx_is_permanent(server, image):
    with pytest.raises(PermanentError) as info:
        _describe(server.agent("badrequest"), image)
    assert info.value.code == "agent_request_rejected"


def test_connection_refused_is_retryable_and_provably_not_executed(image):
    # the port stays bound (not listening) during the call: refused, and nothing else can take it
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
    # The server did receive it: exactly why a retry could double-bill. The handler thread records
    # the request when it has read it, which on a loaded box may come after the client's 0.5 s ran
    # out: wait for it (the request was sent whole before the client waited for an answer).
    poll_until(lambda: any(r["headers"]["Idempotency-Key"] == attempt_id for r in server.requests),
               timeout=30, what="the server to record the request the client gave up on")


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


def test_max_tokens_is_sent(server, image):
    _describe(server.agent("good", max_tokens=321), image)
    assert server.requests[-1]["body"]["max_tokens"] == 321
    _describe(server.agent("good"), image)
    assert server.requests[-1]["body"]["max_tokens"] == 1024


def test_slow_drip_hits_the_total_deadline(server, image):
    """Each byte arrives well within the read timeout; only a total deadline stops the call."""
    agent = server.agent("drip", timeout_s=5, deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as info:
        _describe(agent, image)
    elapsed = time.monotonic() - started
    assert info.value.code == "agent_deadline_exceeded"
    assert elapsed < 1.0 + 4.0, elapsed  # generous: the drip alone would run 20 s


def test_slow_drip_of_headers_hits_the_total_deadline(server, image):
    """The status line and headers are read inside http.client, each read waiting up to the read
    timeout: a provider dripping a header byte by byte must still be stopped by the deadline."""
    agent = server.agent("headerdrip", timeout_s=5, deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as info:
        _describe(agent, image)
    elapsed = time.monotonic() - started
    assert info.value.code == "agent_deadline_exceeded"
    assert elapsed < 1.0 + 4.0, elapsed  # generous: the drip alone would run 20 s
    # the lookup's exchange is bounded the same way (no answer in time proves nothing)
    lookup = OpenAICompatibleAgent(base_url=f"{server.url}/good/v1", model="m", timeout_s=5, deadline_s=1.0,
                                   lookup_url=f"{server.url}/headerdrip/{{attempt_id}}")
    started = time.monotonic()
    assert lookup.lookup(uuid.uuid4().hex).status == "unknown"
    assert time.monotonic() - started < 1.0 + 4.0


def test_a_finished_exchange_leaves_no_watchdog_behind(server, image):
    """The header watchdog is disarmed once the headers arrived: no timer outlives its exchange
    (one left running would shut the socket of a later call on the pooled connection)."""
    from app.stages.agent.watched_http import WATCHDOG_THREAD

    def watchdogs() -> list:
        return [t for t in threading.enumerate() if t.name == WATCHDOG_THREAD and t.is_alive()]

    agent = server.agent("good", deadline_s=30)
    for _ in range(3):
        assert _describe(agent, image).context["title"] == "Sleepy cat"
        deadline = time.monotonic() + 10  # a cancelled timer's thread ends at once; a live one waits 30 s
        while watchdogs() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not watchdogs()


@pytest.mark.parametrize("mode", ["huge", "gzipbomb"])
def test_huge_answer_is_cut_at_the_size_cap(server, image, mode):
    agent = server.agent(mode, max_response_bytes=256 * 1024)
    with pytest.raises(PermanentError) as info:
        _describe(agent, image)
    assert info.value.code == "agent_response_too_large"
    assert "262144" in info.value.message


def test_fence_parse_is_linear_on_pathological_answers():
    """The old ``^```(?:json)?\\s*(.*?)\\s*```$`` regex took 7 s on 2,000 spaces (O(n^3)); these are
    500x longer. A generous bound, not a tight timing: linear parsing takes milliseconds."""
    n = 1_000_000
    payload = json.dumps(GOOD_CONTEXT)
    cases = [
        "```" + " " * n + "x",  # opening fence, spaces, no closing fence
        "```json" + " " * n + payload + " " * n + "`",
        "```" + "\n" * n + "``",
        "```" + " \t" * n + "```" + " " * n + "```",
        "`" * n,
    ]
    started = time.monotonic()
    for text in cases:
        with pytest.raises(PermanentError):
            parse_context(text)
    assert time.monotonic() - started < 5.0
    assert unfence("```json\n" + payload + "\n```") == payload
    assert unfence("```JSON " + payload + "```") == payload
    assert unfence("```\n" + payload + "\n```") == payload
    assert unfence("  " + payload + "\n") == payload
    assert unfence("```") == "```"
    assert parse_context("```json\n" + " " * n + payload + " " * n + "\n```")["title"] == "Sleepy cat"


@pytest.mark.parametrize("mode,options", [
    ("badrequest", {}), ("servererror", {}), ("ratelimited", {}), ("notjson", {}), ("malformed", {}),
    ("slow", {"timeout_s": 0.3}), ("drip", {"deadline_s": 0.5}), ("huge", {"max_response_bytes": 1000}),
])
def test_error_messages_carry_no_provider_body_or_host(server, image, mode, options, caplog):
    """The message is what the orchestrator stores on the task and shows the tenant."""
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level("WARNING", logger="app.stages.agent.openai_compatible"):
        with pytest.raises((PermanentError, RetryableError, OutcomeUnknownError)) as info:
            _describe(server.agent(mode, api_key="sk-live-123456", **options), image)
    message = info.value.message
    assert info.value.code.startswith("agent_")
    for leak in (PROVIDER_SECRET, "sk-", "internal.corp", host, port, "/v1", mode):
        assert leak not in message, (leak, message)
    if mode in ("badrequest", "servererror", "notjson"):
        assert "llm-gw-7.internal.corp" in caplog.text  # the operator still sees it


def test_unreachable_message_carries_no_host(image):
    with socket.socket() as sock:  # bound, not listening, during the call: refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        agent = OpenAICompatibleAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2)
        with pytest.raises(RetryableError) as info:
            _describe(agent, image)
    assert "127.0.0.1" not in info.value.message and str(port) not in info.value.message


def test_a_redirect_is_never_followed(server, image):
    """The provider's 3xx is not followed (a 307 would re-send the paid call, with the image, where
    the provider points — another host, or one inside our network): the call is rejected as a
    4xx is, and the lookup proves nothing."""
    before = len(server.requests)
    agent = server.agent("redirect", lookup_url=f"{server.url}/redirect/{{attempt_id}}")
    with pytest.raises(PermanentError) as err:
        _describe(agent, image)
    assert err.value.code == "agent_request_rejected" and "307" in str(err.value)
    assert [r["mode"] for r in server.requests[before:]] == ["redirect"]  # the good endpoint saw nothing
    assert agent.lookup(uuid.uuid4().hex).status == "unknown"
