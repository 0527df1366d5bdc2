"""``openai-compatible`` agent: one chat-completions call (OpenAI, vLLM, Ollama, LM Studio, ...).

Error classification is what keeps paid calls from being silently repeated (SPEC §4.5):

* refused / DNS / connect timeout -> RetryableError(not_executed=True)
* HTTP 429                         -> RetryableError(agent_rate_limited, not_executed=True)
* HTTP 5xx                         -> RetryableError(agent_server_error, not_executed=False)
* other HTTP 4xx                   -> PermanentError(agent_request_rejected)
* read timeout / lost after send   -> OutcomeUnknownError(agent_outcome_unknown)
* 200 but not the JSON context     -> PermanentError(agent_bad_output)
"""

from __future__ import annotations

import base64
import io
import json
import re
from typing import Any

import requests
from urllib3.exceptions import NewConnectionError

from app.stages.agent.facts import visual_facts
from app.stages.agent.records import check_attempt_id
from app.stages.base import AgentResult, LookupResult, check_reverse_image_policy
from app.stages.errors import OutcomeUnknownError, PermanentError, RetryableError
from app.stages.images import DecodedImage

VERSION = "openai-compatible-v1"
_MAX_LEN = {"title": 200, "description": 4000, "ocr_text": 20000}
_MAX_TAGS, _MAX_TAG_LEN = 30, 64
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

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


def parse_context(content: str) -> dict[str, Any]:
    """Validate the model's JSON into title/description/ocr_text/tags (extra keys dropped)."""
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, ValueError) as exc:
        raise PermanentError(f"agent answer is not JSON: {exc}", code="agent_bad_output") from exc
    if not isinstance(data, dict):
        raise PermanentError("agent answer is not a JSON object", code="agent_bad_output")
    context: dict[str, Any] = {}
    for key, limit in _MAX_LEN.items():
        value = data.get(key)
        if not isinstance(value, str) or len(value) > limit:
            raise PermanentError(
                f"agent answer: {key!r} must be a string of at most {limit} characters",
                code="agent_bad_output",
            )
        context[key] = value.strip()
    tags = data.get("tags")
    if (
        not isinstance(tags, list)
        or len(tags) > _MAX_TAGS
        or not all(isinstance(t, str) and 0 < len(t.strip()) <= _MAX_TAG_LEN for t in tags)
    ):
        raise PermanentError(
            f"agent answer: 'tags' must be a list of at most {_MAX_TAGS} non-empty strings",
            code="agent_bad_output",
        )
    context["tags"] = list(dict.fromkeys(t.strip().lower() for t in tags))
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
    model = body.get("model") if isinstance(body.get("model"), str) else None
    completion_id = body.get("id") if isinstance(body.get("id"), str) else None
    return parse_context(content), model, completion_id


def _sent_nothing(exc: requests.ConnectionError) -> bool:
    """True when the connection was never established (refused, DNS), so nothing was sent."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = exc.args[0] if exc.args else None
    reason = getattr(reason, "reason", reason)  # MaxRetryError wraps the low-level error
    return isinstance(reason, NewConnectionError)  # NameResolutionError is a subclass


class OpenAICompatibleAgent:
    """Calls ``{base_url}/chat/completions`` (image as data URL), parses the JSON."""

    name = "openai-compatible"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        lookup_url: str | None = None,
        max_image_side: int = 1024,
        json_response_format: bool = False,
        **_: Any,
    ) -> None:
        if not base_url or not model:
            raise ValueError("openai-compatible agent needs base_url and model")
        if lookup_url and "{attempt_id}" not in lookup_url:
            raise ValueError("lookup_url must contain the placeholder {attempt_id}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = (float(connect_timeout_s), float(timeout_s))
        self.lookup_url = lookup_url
        self.max_image_side = int(max_image_side)
        self.json_response_format = bool(json_response_format)
        self.session = requests.Session()

    def config(self) -> dict[str, Any]:
        """What determines the answer: endpoint, model, prompt version, image preprocessing."""
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

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """One POST; the attempt id travels as ``Idempotency-Key``. Errors are classified above."""
        check_attempt_id(attempt_id)
        check_reverse_image_policy(reverse_image_policy)
        body = self.request_body(image, reverse_image_policy)
        try:
            response = self.session.post(
                f"{self.base_url}/chat/completions",
                json=body,
                headers=self._headers(attempt_id),
                timeout=self.timeout,
            )
        except requests.ConnectionError as exc:  # includes ConnectTimeout
            if _sent_nothing(exc):
                raise RetryableError(
                    f"agent unreachable: {exc}", code="agent_unreachable", not_executed=True
                ) from exc
            raise OutcomeUnknownError(f"connection lost after sending: {exc}") from exc
        except requests.Timeout as exc:  # read timeout: the request was sent
            raise OutcomeUnknownError(f"no answer within {self.timeout[1]} s: {exc}") from exc
        except requests.RequestException as exc:
            raise OutcomeUnknownError(f"request failed: {exc}") from exc
        return self._result(response, image)

    def _result(self, response: requests.Response, image: DecodedImage | None) -> AgentResult:
        status = response.status_code
        if status == 429:
            raise RetryableError(
                "agent rate limited (HTTP 429)",
                code="agent_rate_limited",
                not_executed=True,
                retry_after_s=_retry_after(response),
            )
        if status >= 500:
            raise RetryableError(
                f"agent server error (HTTP {status})", code="agent_server_error", not_executed=False
            )
        if not 200 <= status < 300:
            raise PermanentError(
                f"agent rejected the request (HTTP {status}): {response.text[:200]}",
                code="agent_request_rejected",
            )
        try:
            payload = response.json()
        except ValueError as exc:
            raise PermanentError(
                "agent response body is not JSON", code="agent_bad_output"
            ) from exc
        context, model, completion_id = parse_completion(payload)
        context["facts"] = visual_facts(image) if image is not None else {}
        request_id = response.headers.get("x-request-id") or completion_id
        return AgentResult(context=context, model=model or self.model, request_id=request_id)

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """Ask ``lookup_url`` about an attempt: 200 = complete, 404 = never received, else unknown.

        The remote answer has no pixel facts; pass ``image`` to fill ``context["facts"]``
        (otherwise it is ``{}``).
        """
        check_attempt_id(attempt_id)
        if not self.lookup_url:
            return LookupResult(status="unknown")
        try:
            response = self.session.get(
                self.lookup_url.format(attempt_id=attempt_id),
                headers=self._headers(attempt_id),
                timeout=self.timeout,
            )
        except requests.RequestException:
            return LookupResult(status="unknown")
        if response.status_code == 404:
            return LookupResult(status="not_received")
        if response.status_code != 200:
            return LookupResult(status="unknown")
        try:
            return LookupResult(status="complete", result=self._result(response, image))
        except PermanentError:
            return LookupResult(status="unknown")  # a 200 we cannot read proves nothing


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
