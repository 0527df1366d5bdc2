"""``local-ocr`` agent: reads image text with RapidOCR (ONNX, offline), builds context."""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Any

from app.stages.agent.facts import describe_facts, visual_facts
from app.stages.agent.records import ResultRecords, check_attempt_id
from app.stages.agent.text_tags import TextBox, group_lines, line_text, salient_words
from app.stages.base import AgentResult, LookupResult, check_reverse_image_policy
from app.stages.errors import PermanentError
from app.stages.images import DecodedImage

VERSION = "local-ocr-v1"
_ENGINE = None
_ENGINE_LOCK = threading.Lock()


def ocr_engine():
    """The process-wide RapidOCR engine, created on first use (loading takes ~1 s)."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            from rapidocr_onnxruntime import RapidOCR

            _ENGINE = RapidOCR()
        return _ENGINE


def _rapidocr_version() -> str:
    try:
        return metadata.version("rapidocr-onnxruntime")
    except metadata.PackageNotFoundError:
        return "unknown"


class LocalOcrAgent:
    """Default agent: OCR text, the most prominent line as title, salient words as tags, facts.

    Writes each result to ``results_dir/<attempt_id>.json`` before returning it, so ``lookup``
    can answer for attempts finished by a worker that died before committing.
    """

    name = "local-ocr"

    def __init__(self, *, results_dir: str, min_score: float = 0.5, max_tags: int = 10, **_: Any):
        if not results_dir:
            raise ValueError("local-ocr agent needs results_dir (where attempt results are kept)")
        self.records = ResultRecords(results_dir)
        self.min_score = float(min_score)
        self.max_tags = int(max_tags)

    def config(self) -> dict[str, Any]:
        """Identity of the OCR pipeline and of how its output becomes a context."""
        return {
            "provider": self.name,
            "model": f"rapidocr-onnxruntime-{_rapidocr_version()}:ppocrv4-det-rec",
            "version": VERSION,
            "min_score": self.min_score,
            "max_tags": self.max_tags,
        }

    def read_text(self, image: DecodedImage) -> list[TextBox]:
        """Recognised fragments scoring at least ``min_score``."""
        try:
            raw, _timings = ocr_engine()(image.image)
        except Exception as exc:  # the engine failing on valid pixels will not improve on retry
            raise PermanentError(f"OCR failed: {exc}", code="agent_ocr_failed") from exc
        boxes = []
        for points, text, score in raw or []:
            if float(score) < self.min_score or not str(text).strip():
                continue
            xs = [float(p[0]) for p in points]
            ys = [float(p[1]) for p in points]
            boxes.append(TextBox(str(text), min(xs), min(ys), max(xs), max(ys), float(score)))
        return boxes

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """OCR the image and record the result durably before returning it."""
        check_attempt_id(attempt_id)
        check_reverse_image_policy(reverse_image_policy)  # local OCR never searches the web
        lines = group_lines(self.read_text(image))
        facts = visual_facts(image)
        title = ""
        if lines:
            title = line_text(max(lines, key=lambda line: max(b.height for b in line)))
        ocr_text = "\n".join(line_text(line) for line in lines)
        description = describe_facts(facts)
        if ocr_text:
            description += f" Text: {ocr_text.replace(chr(10), ' / ')}"
        context = {
            "title": title,
            "description": description,
            "ocr_text": ocr_text,
            "tags": salient_words(lines, self.max_tags),
            "facts": facts,
        }
        result = AgentResult(context=context, model=self.config()["model"], request_id=attempt_id)
        self.records.write(attempt_id, result)
        return result

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """``complete`` with the recorded result, or ``not_received`` if none was recorded."""
        result = self.records.read(attempt_id)
        if result is None:
            return LookupResult(status="not_received")
        return LookupResult(status="complete", result=result)
