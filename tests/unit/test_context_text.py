"""How a context's title and tags read (app/stages/agent/context_text.py), and that every agent
writes them so: an agent's context saved back unchanged through PATCH is stored unchanged."""

from __future__ import annotations

import uuid

from PIL import Image

from app.api.schemas import ContextSchema
from app.stages.agent.context_text import normalise_tags, single_line, tag_key
from app.stages.agent.openai_compatible import parse_context

from .stages.helpers import decoded


def test_a_title_is_one_line():
    assert single_line("  Deploy\r\nfreeze,\t\u3000Friday \u2028") == "Deploy freeze, Friday"
    assert single_line(" \n ") == ""


def test_tags_are_trimmed_single_spaced_and_each_once_in_the_first_spelling():
    tags = [" Cat ", "cat", "ＣＡＴ", "", "  ", "big\n\n cat", "BIG CAT", "yes, and", "周五", "周五\u3000",
            "Straße", "STRASSE", "ﬁre", "fire"]
    assert normalise_tags(tags) == ["Cat", "big cat", "yes, and", "周五", "Straße", "ﬁre"]
    assert tag_key("ＣＡＴ　Meme") == tag_key("cat meme") == "cat meme"
    assert normalise_tags(normalise_tags(tags)) == normalise_tags(tags)


def test_tags_without_a_visible_character_are_dropped_and_invisible_ones_do_not_count():
    tags = ["\u200b", "\ufeff", "\u200d", "\u0301", " \u2060 ", "\u00ad", "\u200bcat\u200b", "cat", "ca\u00adt",
            "👨\u200d👩\u200d👧", "\ue000", "e\u0301t\u00e9"]
    assert normalise_tags(tags) == ["cat", "👨\u200d👩\u200d👧", "\ue000", "e\u0301t\u00e9"]
    assert normalise_tags(normalise_tags(tags)) == normalise_tags(tags)


def test_an_openai_compatible_answer_is_normalised_as_an_edit_is():
    answer = ('{"title": "Sleepy\\ncat  on a desk", "description": "d", "ocr_text": "",'
              ' "tags": ["Cat", " cat", "ＣＡＴ", "sleepy  cat", "Sleepy Cat"]}')
    ctx = parse_context(answer)
    assert ctx["title"] == "Sleepy cat on a desk" and ctx["tags"] == ["cat", "sleepy cat"]
    assert ContextSchema().load(ctx) == ctx  # saved back unchanged: a no-op


def test_a_local_ocr_title_is_one_line(tmp_path, monkeypatch):
    from app.stages.agent import local_ocr

    def box(y: int, height: int, text: str):
        return [[0, y], [900, y], [900, y + height], [0, y + height]], text, 0.99

    raw = [box(0, 60, "BIG   NEWS\tTODAY"), box(80, 20, "the deploy  froze")]
    monkeypatch.setattr(local_ocr, "run_ocr", lambda settings, picture: raw)
    agent = local_ocr.LocalOcrAgent(results_dir=str(tmp_path))
    ctx = agent.describe(decoded(Image.new("RGB", (64, 48), "white")), attempt_id=uuid.uuid4().hex,
                         reverse_image_policy="forbid").context
    assert ctx["title"] == "BIG NEWS TODAY"
    editable = {k: v for k, v in ctx.items() if k != "facts"}
    assert ContextSchema().load(editable) == editable
