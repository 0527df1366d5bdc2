"""local-ocr agent: real RapidOCR on rendered English and Chinese text; durable result records."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from app.stages.agent.local_ocr import LocalOcrAgent
from app.stages.base import config_hash
from app.stages.errors import PermanentError

from .helpers import decoded

# fonts-dejavu-core and fonts-wqy-microhei (apt) provide these.
LATIN_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
CJK_FONT = "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc"


def _render(lines: list[tuple[str, int]], font_path: str, size=(520, 220)) -> Image.Image:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    y = 16
    for text, font_size in lines:
        draw.text((16, y), text, font=ImageFont.truetype(font_path, font_size), fill="black")
        y += int(font_size * 1.6)
    return img


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> LocalOcrAgent:
    return LocalOcrAgent(results_dir=str(tmp_path_factory.mktemp("agent-results")))


@pytest.fixture(scope="module")
def english(agent):
    image = decoded(_render([("MONDAY COFFEE", 52), ("SLEEPY   CAT", 34)], LATIN_FONT))
    attempt_id = uuid.uuid4().hex
    return attempt_id, agent.describe(image, attempt_id=attempt_id, reverse_image_policy="forbid")


def test_english_words_appear_in_context(english):
    _, result = english
    ctx = result.context
    assert set(ctx) == {"title", "description", "ocr_text", "tags", "facts"}
    for word in ("MONDAY", "COFFEE", "SLEEPY", "CAT"):
        assert word in ctx["ocr_text"].upper()
    # Reading order: the first rendered line comes first.
    assert ctx["ocr_text"].upper().index("MONDAY") < ctx["ocr_text"].upper().index("SLEEPY")
    assert "MONDAY" in ctx["title"].upper() and "SLEEPY" not in ctx["title"].upper()
    assert {"monday", "coffee"} <= set(ctx["tags"])
    assert all(tag == tag.lower() for tag in ctx["tags"])
    assert ctx["facts"]["width"] == 520 and ctx["facts"]["height"] == 220
    assert ctx["facts"]["animated"] is False
    assert ctx["facts"]["dominant_colors"][0] == "#ffffff"


def test_chinese_text_is_read(agent):
    image = decoded(_render([("你好世界", 64)], CJK_FONT, size=(360, 120)))
    result = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="auto")
    assert "你好世界" in result.context["ocr_text"]
    assert "你好世界" in result.context["tags"]


def test_image_without_text_gives_empty_text_and_valid_context(agent):
    image = decoded(Image.new("RGB", (96, 64), (20, 120, 200)))
    result = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid")
    ctx = result.context
    assert ctx["ocr_text"] == "" and ctx["title"] == "" and ctx["tags"] == []
    assert ctx["description"]
    assert ctx["facts"] == {
        "width": 96,
        "height": 64,
        "dominant_colors": ["#1478c8"],
        "animated": False,
    }
    json.dumps(result.context)  # the context must be JSON-serialisable as stored


def test_result_is_recorded_and_adoptable_from_a_new_instance(agent, english):
    attempt_id, result = english
    record = Path(agent.records.results_dir) / f"{attempt_id}.json"
    assert record.is_file()
    fresh = LocalOcrAgent(results_dir=str(agent.records.results_dir))  # "another process"
    found = fresh.lookup(attempt_id)
    assert found.status == "complete"
    assert found.result == result
    assert fresh.lookup(uuid.uuid4().hex).status == "not_received"


def test_unsafe_attempt_id_is_rejected(agent):
    with pytest.raises(PermanentError) as info:
        agent.lookup("../../etc/passwd")
    assert info.value.code == "invalid_attempt_id"


def test_unknown_reverse_image_policy_is_rejected(agent):
    image = decoded(Image.new("RGB", (8, 8)))
    with pytest.raises(PermanentError) as info:
        agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="always")
    assert info.value.code == "invalid_reverse_image_policy"


def test_config_is_stable_and_hashable(agent):
    cfg = agent.config()
    assert {"provider", "model", "version"} <= cfg.keys()
    assert config_hash(cfg) == config_hash(dict(reversed(list(cfg.items()))))
