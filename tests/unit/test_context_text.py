"""How a context's title and tags read (app/stages/agent/context_text.py), and that every agent
writes them so: an agent's context saved back unchanged through PATCH is stored unchanged."""

from __future__ import annotations

import uuid

import pytest
from PIL import Image

from app.api.schemas import ContextSchema
from app.stages.agent import limits
from app.stages.agent.context_text import checked_agent_context, normalise_tags, single_line, tag_key
from app.stages.agent.openai_compatible import parse_context
from app.stages.errors import PermanentError
from tests.support.poison import nested

from .stages.helpers import decoded

GOOD = {"title": "Sleepy cat", "description": "A cat.", "ocr_text": "MONDAY", "tags": ["cat"], "facts": {"width": 4}}


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


def test_an_agent_context_is_stored_as_a_patch_would_store_it():
    """Any agent's context (app/worker/executor.py checks every one): the title one line, the tags
    normalised, keys beyond the context's dropped — and what it returns a PATCH stores unchanged."""
    ctx = checked_agent_context({**GOOD, "title": " Sleepy\ncat ", "tags": ["Cat", "cat", " "], "extra": 1})
    assert ctx == {**GOOD, "title": "Sleepy cat", "tags": ["Cat"]}
    editable = {k: v for k, v in ctx.items() if k != "facts"}
    assert ContextSchema().load(editable) == editable
    assert checked_agent_context({k: v for k, v in GOOD.items() if k != "facts"})["facts"] == {}


@pytest.mark.parametrize("change", [
    {"tags": 5}, {"tags": "cat"}, {"tags": {"a": 1}}, {"tags": [1]}, {"tags": None}, {"title": ["a", "list"]},
    {"title": None}, {"description": 3}, {"ocr_text": {"x": 1}}, {"facts": []},
    {"title": "a\x00b"}, {"ocr_text": "line\ud800"}, {"tags": ["ok", "a\x00b"]},
    {"title": "t" * (limits.TITLE_MAX + 1)}, {"description": "d" * (limits.DESCRIPTION_MAX + 1)},
    {"ocr_text": "o" * (limits.OCR_TEXT_MAX + 1)}, {"tags": ["x" * (limits.TAG_MAX + 1)]},
    {"tags": [f"t{i}" for i in range(limits.TAGS_MAX + 1)]}, {"tags": ["t"] * 10**6},
    {"facts": nested(100_000)}, {"facts": nested(limits.FACTS_DEPTH_MAX + 1)}, {"facts": {"x": float("nan")}},
    {"facts": {"x": [float("-inf")]}}, {"facts": {"x": b"bytes"}}, {"facts": {"x": {1, 2}}}, {"facts": {1: "x"}},
    {"facts": {"a\x00": 1}}, {"facts": {"x": ["a\ud800"]}}, {"facts": {"x": "y" * limits.FACTS_MAX_BYTES}},
    # more digits than Python turns into a string (4300): json.dumps raised ValueError, an internal_error
    {"facts": {"x": 10**5000}}, {"facts": {"x": [-(10**4400)]}},
])
def test_an_agent_context_a_patch_would_refuse_is_agent_bad_output(change):
    with pytest.raises(PermanentError) as info:
        checked_agent_context({**GOOD, **change})
    assert info.value.code == "agent_bad_output"


@pytest.mark.parametrize("context", [None, [], "context", 5])
def test_an_agent_context_that_is_no_object_is_agent_bad_output(context):
    with pytest.raises(PermanentError) as info:
        checked_agent_context(context)
    assert info.value.code == "agent_bad_output"


def test_an_openai_compatible_tag_that_lower_casing_makes_too_long_is_agent_bad_output():
    """The parser checks a tag's 64 characters before lower-casing it, and "İ".lower() is two."""
    ctx = parse_context('{"title": "t", "description": "", "ocr_text": "", "tags": ["' + "\\u0130" * 64 + '"]}')
    assert len(ctx["tags"][0]) > limits.TAG_MAX
    with pytest.raises(PermanentError) as info:
        checked_agent_context({**ctx, "facts": {}})
    assert info.value.code == "agent_bad_output"


def test_agent_facts_are_stored_as_plain_json():
    """Pixel facts a plugin computed with NumPy (its integers are no ``int``) are stored as the
    plain numbers they are, not as ``str()`` of them; nesting up to the limit is kept."""
    import numpy as np

    facts = {"width": np.int64(4), "mean": np.float32(0.5), "ok": np.bool_(True), "none": None,
             "deep": nested(limits.FACTS_DEPTH_MAX - 1)}
    got = checked_agent_context({**GOOD, "facts": facts})["facts"]
    assert got == {"width": 4, "mean": 0.5, "ok": True, "none": None, "deep": nested(limits.FACTS_DEPTH_MAX - 1)}
    assert type(got["width"]) is int and type(got["mean"]) is float and got["ok"] is True
