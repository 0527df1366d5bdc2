"""``openai-compatible`` agent: one chat-completions call (OpenAI, vLLM, Ollama, LM Studio, ...).

Error classification is what keeps paid calls from being silently repeated (SPEC §4.5):

* failed before the request started -> RetryableError(agent_unreachable, not_executed=True)
  (refused, DNS, TCP connect, TLS handshake or a proxy's CONNECT failed, timed out or passed
  the deadline)
* HTTP 429                         -> RetryableError(agent_rate_limited, not_executed=True)
* HTTP 408, 425                    -> RetryableError(agent_request_not_taken, not_executed=True)
* HTTP 5xx                         -> RetryableError(agent_server_error, not_executed=False)
* other HTTP 4xx, any 3xx          -> PermanentError(agent_request_rejected) (redirects are never
  followed: a 307 would re-send the paid call, with the image, wherever the provider points)
* read timeout / lost after send   -> OutcomeUnknownError(agent_outcome_unknown)
* 200 but not the JSON context     -> PermanentError(agent_bad_output) (also: a body that does not
  decode as its Content-Encoding says)
* answer body over the size cap     -> PermanentError(agent_response_too_large)
* total deadline passed after send  -> OutcomeUnknownError(agent_deadline_exceeded)

"Before the request started" is recorded by the connection itself (``Watch``), not guessed from
exception types: once it starts sending, every failure leaves the outcome unknown.

Hostile or broken providers are bounded: the request asks for at most ``max_tokens``; the answer
is streamed and cut at ``max_response_bytes`` (decoded); the whole call — connect, TLS handshake,
request, headers, body — has one ``deadline_s``: name resolution, each address's TCP connect, the
TLS handshake and the headers are bounded by it (:mod:`app.stages.agent.watched_http`); each body
read waits at most what is left.

The Markdown fence around the JSON is stripped in linear time. The messages these errors carry are
stored on tasks and shown to tenants, so they are generic: status codes and our own limits only.
Provider bodies, URLs and host names go to the log.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from urllib3.exceptions import DecodeError

from app.stages.agent.context_text import normalise_tags, single_line, storable_name
from app.stages.agent.facts import visual_facts
from app.stages.agent.records import check_attempt_id
from app.stages.agent.watched_http import DeadlineAdapter, Watch
from app.stages.base import AgentResult, LookupResult, check_reverse_image_policy
from app.stages.errors import OutcomeUnknownError, PermanentError, RetryableError, StageError
from app.stages.images import DecodedImage

VERSION = "openai-compatible-v1"
_MAX_LEN = {"title": 200, "description": 4000, "ocr_text": 20000}
# NUL and UTF-16 surrogates (a JSON "\ud800" escape decodes to one): PostgreSQL stores neither in
# text or jsonb, and a completion that tried would fail its whole batch (as app.api.schemas.Text)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_MAX_TAGS, _MAX_TAG_LEN = 30, 64
_FENCE = "```"
READ_CHUNK = 64 * 1024
log = logging.getLogger(__name__)

PROMPT = (
    "You describe images for a searchable meme library. Reply with one JSON object and nothing "
    'else, with exactly these keys: "title" (string, a short name for the image), "description" '
    '(string, one or two sentences about what is shown), "ocr_text" (string, all text visible in '
    'the image in reading order, lines separated by \\n, empty if none), "tags" (array of short '
    "lowercase strings)."
)
POLICY_PROMPTS = {
    "forbid": (
        "Do not search for, name or guess the source of this image; describe only what is visible."
    ),
    "auto": (
        "You may name a well-known meme template or source if you recognise it with confidence."
    ),
}


def unfence(text: str) -> str:
    """The JSON inside one Markdown code fence around the whole answer (```json … ```), else
    ``text`` itself. Linear time: prefix and suffix checks and one strip, no backtracking."""
    text = text.strip()
    if len(text) < 2 * len(_FENCE) or not (text.startswith(_FENCE) and text.endswith(_FENCE)):
        return text
    inner = text[len(_FENCE):-len(_FENCE)]
    if inner[:4].lower() == "json":
        inner = inner[4:]
    return inner.strip()


def parse_context(content: str) -> dict[str, Any]:
    """Validate the model's JSON into title/description/ocr_text/tags (extra keys dropped)."""
    text = unfence(content)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise PermanentError(f"agent answer is not JSON: {exc}", code="agent_bad_output") from exc
    if not isinstance(data, dict):
        raise PermanentError("agent answer is not a JSON object", code="agent_bad_output")
    context: dict[str, Any] = {}
    for key, limit in _MAX_LEN.items():
        value = data.get(key)
        if not isinstance(value, str) or len(value) > limit or _UNSTORABLE.search(value):
            raise PermanentError(
                f"agent answer: {key!r} must be a string of at most {limit} characters, without NUL "
                "or unpaired surrogates",
                code="agent_bad_output",
            )
        context[key] = single_line(value) if key == "title" else value.strip()
    tags = data.get("tags")
    if (
        not isinstance(tags, list)
        or len(tags) > _MAX_TAGS
        or not all(isinstance(t, str) and 0 < len(t.strip()) <= _MAX_TAG_LEN and not _UNSTORABLE.search(t)
                   for t in tags)
    ):
        raise PermanentError(
            f"agent answer: 'tags' must be a list of at most {_MAX_TAGS} non-empty strings, without NUL "
            "or unpaired surrogates",
            code="agent_bad_output",
        )
    context["tags"] = normalise_tags(t.lower() for t in tags)  # as a human's edit is stored
    return context


def parse_completion(body: Any) -> tuple[dict[str, Any], str | None, str | None]:
    """Pull (context, model, completion id) out of a chat-completion response body."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise PermanentError(
            "response is not a chat completion (choices[0].message.content missing)",
            code="agent_bad_output",
        ) from exc
    if not isinstance(content, str):
        raise PermanentError("choices[0].message.content is not a string", code="agent_bad_output")
    return parse_context(content), _storable_id(body.get("model")), _storable_id(body.get("id"))


def _storable_id(value: Any) -> str | None:
    """A provider-chosen string name fit to store, else None (:func:`storable_name`)."""
    return storable_name(value) if isinstance(value, str) else None


class _NothingSent(Exception):
    """The exchange failed before its request started: no byte of it reached the provider."""


class _DeadlineExceeded(Exception):
    """The call's total deadline passed while the answer was still arriving."""


@dataclass(frozen=True)
class _Answer:
    """A provider's HTTP answer, read in full within the size cap and the deadline."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def text(self, limit: int = 500) -> str:
        return self.body[:limit].decode("utf-8", "replace")


class OpenAICompatibleAgent:
    """Calls ``{base_url}/chat/completions`` (image as data URL), parses the JSON."""

    name = "openai-compatible"
    recall_safe = False  # a remote call may be billed: an interrupted one is never re-run blindly (SPEC §4.5)

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        deadline_s: float | None = None,
        max_tokens: int = 1024,
        max_response_bytes: int = 1024 * 1024,
        lookup_url: str | None = None,
        max_image_side: int = 1024,
        json_response_format: bool = False,
        **_: Any,
    ) -> None:
        if not base_url or not model:
            raise ValueError("openai-compatible agent needs base_url and model")
        if lookup_url and "{attempt_id}" not in lookup_url:
            raise ValueError("lookup_url must contain the placeholder {attempt_id}")
        if int(max_tokens) < 1 or int(max_response_bytes) < 1:
            raise ValueError("max_tokens and max_response_bytes must be positive")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = (float(connect_timeout_s), float(timeout_s))
        # One budget for the whole call; by default the read timeout plus the connect timeout.
        self.deadline_s = float(deadline_s) if deadline_s else float(connect_timeout_s) + float(timeout_s)
        self.max_tokens = int(max_tokens)
        self.max_response_bytes = int(max_response_bytes)
        self.lookup_url = lookup_url
        self.max_image_side = int(max_image_side)
        self.json_response_format = bool(json_response_format)
        self.session = requests.Session()
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, DeadlineAdapter())

    def config(self) -> dict[str, Any]:
        """What determines the answer: endpoint, model, prompt version, image preprocessing.

        ``max_tokens`` and the size/time limits are not in it: an answer they cut short fails
        (``agent_bad_output``, ``agent_response_too_large``, ...) instead of becoming another answer.
        """
        return {
            "provider": self.name,
            "model": self.model,
            "version": VERSION,
            "base_url": self.base_url,
            "max_image_side": self.max_image_side,
        }

    def _headers(self, attempt_id: str) -> dict[str, str]:
        headers = {"Idempotency-Key": attempt_id, "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _data_url(self, image: DecodedImage) -> str:
        picture = image.image
        if max(picture.size) > self.max_image_side:
            picture = picture.copy()
            picture.thumbnail((self.max_image_side, self.max_image_side))
        buf = io.BytesIO()
        picture.save(buf, format="JPEG", quality=90)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    def request_body(self, image: DecodedImage, reverse_image_policy: str) -> dict[str, Any]:
        """The chat-completions payload for one image."""
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "messages": [
                {"role": "system", "content": PROMPT + " " + POLICY_PROMPTS[reverse_image_policy]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe this image as the JSON object."},
                        {"type": "image_url", "image_url": {"url": self._data_url(image)}},
                    ],
                },
            ],
        }
        if self.json_response_format:
            body["response_format"] = {"type": "json_object"}
        return body

    def _exchange(self, method: str, url: str, deadline: float, **kwargs: Any) -> _Answer:
        """One HTTP exchange, streamed: the body is read in chunks, each socket read waiting at
        most what is left before ``deadline``, and cut at ``max_response_bytes``."""
        remaining = deadline - time.monotonic()
        with Watch(deadline) as watch:
            try:
                response = self.session.request(
                    method, url, timeout=(min(self.timeout[0], remaining), max(0.001, min(self.timeout[1], remaining))),
                    stream=True, allow_redirects=False, **kwargs,  # a 3xx fails the call (``_result``)
                )
            except Exception as exc:
                if watch.nothing_sent():  # refused, DNS, connect or TLS handshake failed or timed out
                    raise _NothingSent from exc
                if watch.fired:
                    raise _DeadlineExceeded from None
                raise
        if watch.fired:  # headers cut short by the watchdog: not the provider's answer
            response.close()
            raise _DeadlineExceeded
        with response:
            conn = getattr(response.raw, "connection", None)
            sock = getattr(conn, "sock", None)
            chunks, size = [], 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _DeadlineExceeded
                if sock is not None:
                    sock.settimeout(min(remaining, self.timeout[1]))
                try:
                    chunk = response.raw.read1(READ_CHUNK, decode_content=True)
                except DecodeError as exc:  # the provider answered: a body not in the encoding it claims
                    log.warning("agent answer from %s does not decode (HTTP %d, Content-Encoding %r): %s", url,
                                response.status_code, response.headers.get("Content-Encoding"), exc)
                    if not 200 <= response.status_code < 300:  # its status and headers decide (a 429's wait)
                        return _Answer(response.status_code, response.headers, b"".join(chunks))
                    raise PermanentError("the agent's answer does not decode as its Content-Encoding says",
                                         code="agent_bad_output") from None
                except Exception:
                    if deadline - time.monotonic() <= 0:
                        raise _DeadlineExceeded from None
                    raise
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_response_bytes:
                    log.warning("agent answer from %s exceeds %d bytes; cut", url, self.max_response_bytes)
                    raise PermanentError(
                        f"the agent's answer exceeds the limit of {self.max_response_bytes} bytes",
                        code="agent_response_too_large",
                    )
                chunks.append(chunk)
            return _Answer(response.status_code, response.headers, b"".join(chunks))

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """One POST; the attempt id travels as ``Idempotency-Key``. Errors are classified above."""
        check_attempt_id(attempt_id)
        check_reverse_image_policy(reverse_image_policy)
        body = self.request_body(image, reverse_image_policy)
        url = f"{self.base_url}/chat/completions"
        deadline = time.monotonic() + self.deadline_s
        try:
            answer = self._exchange("POST", url, deadline, json=body, headers=self._headers(attempt_id))
        except StageError:
            raise
        except _DeadlineExceeded:
            log.warning("agent call to %s passed its deadline of %s s", url, self.deadline_s)
            raise OutcomeUnknownError(
                f"the agent call was sent but did not finish within {self.deadline_s:g} s; its outcome is unknown",
                code="agent_deadline_exceeded",
            ) from None
        except _NothingSent as exc:
            log.warning("agent unreachable at %s: %r", url, exc.__cause__)
            raise RetryableError(
                "the agent endpoint could not be reached; nothing was sent",
                code="agent_unreachable", not_executed=True,
            ) from None
        except requests.ConnectionError as exc:  # the request had started: it may have arrived
            log.warning("agent connection to %s lost after sending: %s", url, exc)
            raise OutcomeUnknownError("the connection to the agent was lost after sending; the outcome is unknown") \
                from None
        except requests.Timeout as exc:  # read timeout: the request was sent
            log.warning("agent at %s gave no answer in time: %s", url, exc)
            raise OutcomeUnknownError(
                f"the agent sent no answer within {self.timeout[1]:g} s; the outcome is unknown"
            ) from None
        except Exception as exc:  # noqa: BLE001 - any other transport failure after the call may have gone out
            log.warning("agent request to %s failed: %r", url, exc)
            raise OutcomeUnknownError("the agent request failed after it may have been sent; the outcome is unknown") \
                from None
        return self._result(answer, image, url)

    def _result(self, answer: _Answer, image: DecodedImage | None, url: str) -> AgentResult:
        status = answer.status
        if not 200 <= status < 300:
            log.warning("agent at %s answered HTTP %d: %s", url, status, answer.text())
        if status == 429:
            raise RetryableError(
                "the agent provider rate-limited the call (HTTP 429)",
                code="agent_rate_limited",
                not_executed=True,
                retry_after_s=_retry_after(answer.headers),
            )
        if status in (408, 425):  # Request Timeout / Too Early: the server did not take the request
            raise RetryableError(
                f"the agent provider did not take the request (HTTP {status})",
                code="agent_request_not_taken", not_executed=True, retry_after_s=_retry_after(answer.headers),
            )
        if status >= 500:
            raise RetryableError(
                f"the agent provider failed (HTTP {status})", code="agent_server_error", not_executed=False
            )
        if 300 <= status < 400:  # never followed: a 307 would re-send the paid call wherever it points
            raise PermanentError(
                f"the agent provider redirected the request (HTTP {status}); redirects are not followed — "
                "configure the endpoint's final URL", code="agent_request_rejected",
            )
        if not 200 <= status < 300:
            raise PermanentError(
                f"the agent provider rejected the request (HTTP {status})", code="agent_request_rejected",
            )
        try:
            payload = json.loads(answer.body)
        except (ValueError, RecursionError) as exc:
            log.warning("agent at %s answered a body that is not JSON: %s", url, answer.text(200))
            raise PermanentError("the agent's response body is not JSON", code="agent_bad_output") from exc
        context, model, completion_id = parse_completion(payload)
        context["facts"] = visual_facts(image) if image is not None else {}
        request_id = _storable_id(answer.headers.get("x-request-id")) or completion_id
        return AgentResult(context=context, model=model or self.model, request_id=request_id)

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """Ask ``lookup_url`` about an attempt: 200 = complete, 404 = never received, else unknown.

        The remote answer has no pixel facts; pass ``image`` to fill ``context["facts"]``
        (otherwise it is ``{}``).
        """
        check_attempt_id(attempt_id)
        if not self.lookup_url:
            return LookupResult(status="unknown")
        url = self.lookup_url.format(attempt_id=attempt_id)
        try:
            answer = self._exchange("GET", url, time.monotonic() + self.deadline_s, headers=self._headers(attempt_id))
        except Exception as exc:  # noqa: BLE001 - no readable answer proves nothing either way
            log.warning("agent lookup at %s failed: %r", url, exc)
            return LookupResult(status="unknown")
        if answer.status == 404:
            return LookupResult(status="not_received")
        if answer.status != 200:
            log.warning("agent lookup at %s answered HTTP %d: %s", url, answer.status, answer.text())
            return LookupResult(status="unknown")
        try:
            return LookupResult(status="complete", result=self._result(answer, image, url))
        except PermanentError:
            return LookupResult(status="unknown")  # a 200 we cannot read proves nothing


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds (its HTTP-date form, ``inf`` or ``nan``: None — not a wait we can use)."""
    value = headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None
