"""``local-ocr`` agent: reads image text offline (PP-OCR through RapidOCR), builds a context."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

from app.stages.agent import limits, ocr_engine
from app.stages.agent.context_text import normalise_tags, single_line
from app.stages.agent.facts import visual_facts
from app.stages.agent.ocr_engine import OcrSettings, run_ocr
from app.stages.agent.records import ResultRecords, check_attempt_id
from app.stages.agent.text_tags import TextBox, group_lines, line_text, salient_words
from app.stages.base import AgentResult, LookupResult, check_reverse_image_policy
from app.stages.cpu import available_cores
from app.stages.errors import PermanentError
from app.stages.images import DecodedImage

VERSION = "local-ocr-v2"
_OCR_FIELDS = frozenset(f.name for f in fields(OcrSettings))
log = logging.getLogger(__name__)


class LocalOcrAgent:
    """Default agent: OCR text, the most prominent line as title, salient words as tags, facts.

    The context carries meaning only: ``ocr_text``, ``title`` and ``tags``. ``description`` is
    left empty: OCR knows nothing about the image beyond its text, which ``ocr_text`` already
    holds, and a sentence of visual facts (size, colours) diluted the document search embeds.
    Those facts stay under ``facts``.

    OCR options (see :class:`~app.stages.agent.ocr_engine.OcrSettings`) may be passed as
    keyword arguments: ``det_model``, ``rec_model``, ``det_limit_type``, ...

    Writes each result to ``results_dir/<attempt_id>.json`` before returning it, so ``lookup``
    can answer for attempts finished by a worker that died before committing — on any machine,
    as ``results_dir`` is shared (``legacy_results_dir``: older versions' records, read only).
    """

    name = "local-ocr"
    recall_safe = True  # local compute: a re-run after a worker's death repeats no external effect and costs nothing

    def __init__(
        self, *, results_dir: str, legacy_results_dir: str | None = None, min_score: float = 0.5,
        max_tags: int = 10, **options: Any
    ):
        if not results_dir:
            raise ValueError("local-ocr agent needs results_dir (where attempt results are kept)")
        self.records = ResultRecords(results_dir, legacy_dir=legacy_results_dir)
        self.min_score = float(min_score)
        self.max_tags = int(max_tags)
        self.ocr = OcrSettings(**{k: v for k, v in options.items() if k in _OCR_FIELDS})

    def config(self) -> dict[str, Any]:
        """Identity of the OCR model and settings and of how their output becomes a context."""
        return {
            "provider": self.name,
            "model": self.ocr.name,
            "version": VERSION,
            "ocr": self.ocr.identity(),
            "min_score": self.min_score,
            "max_tags": self.max_tags,
        }

    def warm(self, concurrency: int | None = None) -> None:
        """Load the OCR models now, one engine per concurrent call (default: one per core), and
        run each once, so a worker's first tasks do not pay for it."""
        ocr_engine.warm(self.ocr, concurrency or available_cores())

    def read_text(self, image: DecodedImage) -> list[TextBox]:
        """Recognised fragments scoring at least ``min_score``."""
        try:
            raw = run_ocr(self.ocr, image.image)
        except Exception as exc:  # the engine failing on valid pixels will not improve on retry
            # the message is stored on the task and shown to the tenant: the engine's own text
            # (model paths, library internals) goes to the log only
            log.warning("OCR failed: %r", exc, exc_info=exc)
            raise PermanentError("OCR failed on this image; the worker's log has the details",
                                 code="agent_ocr_failed") from exc
        boxes = []
        for points, text, score in raw:
            if score < self.min_score or not text.strip():
                continue
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            boxes.append(TextBox(text, min(xs), min(ys), max(xs), max(ys), score))
        return boxes

    def read_lines(self, image: DecodedImage) -> list[list[TextBox]]:
        """The recognised fragments grouped into visual lines, in reading order."""
        return group_lines(self.read_text(image))

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """OCR the image and record the result durably before returning it."""
        check_attempt_id(attempt_id)
        check_reverse_image_policy(reverse_image_policy)  # local OCR never searches the web
        lines = self.read_lines(image)
        texts = [line_text(line) for line in lines]
        title = ""
        if lines:
            title = line_text(max(lines, key=lambda line: max(b.height for b in line)))
        # within what a human may write (app/stages/agent/limits.py): a screenshot full of text
        # reads past it, and a context the edit form cannot save back is a trap; a tag is a
        # word or a short caption, so a whole long line (a CJK "word") is no tag
        tags = normalise_tags(t for t in salient_words(lines, limit=None) if len(t) <= limits.TAG_MAX)
        context = {
            # one line, as PATCH stores a title (app/stages/agent/context_text.py)
            "title": single_line(title)[:limits.TITLE_MAX].rstrip(),
            "description": "",
            "ocr_text": "\n".join(texts)[:limits.OCR_TEXT_MAX],
            "tags": tags[:min(self.max_tags, limits.TAGS_MAX)],
            "facts": visual_facts(image),
        }
        result = AgentResult(context=context, model=self.ocr.name, request_id=attempt_id)  # config()["model"]
        self.records.write(attempt_id, result)
        return result

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """``complete`` with the recorded result, or ``not_received`` if none was recorded."""
        result = self.records.read(attempt_id)
        if result is None:
            return LookupResult(status="not_received")
        return LookupResult(status="complete", result=result)

