"""The internet-slang glossaries and document version 5 (app/search/slang.py, app/orchestrator/fingerprints.py)."""

from __future__ import annotations

import unicodedata
from importlib import resources

import pytest

from app.orchestrator.fingerprints import DEFAULT_DOCUMENT_VERSION, semantic_document, semantic_query
from app.search import slang
from app.search.slang import Glossary


def _rows(name: str) -> list[tuple[str, str]]:
    text = resources.files("app.search").joinpath("data", name).read_text(encoding="utf-8")
    return [tuple(line.split("\t")) for line in text.splitlines() if line.strip() and not line.startswith(("#", "!"))]


@pytest.mark.parametrize(("name", "minimum"), [(slang.CHINESE, 350), (slang.ENGLISH, 100)])
def test_the_glossaries_load_and_are_clean(name, minimum):
    rows = _rows(name)
    assert all(len(row) == 2 for row in rows)
    assert len(rows) >= minimum
    terms = [slang.normalise(term) for term, _ in rows]
    assert len(set(terms)) == len(terms), "duplicate terms"
    assert all(term and gloss.strip() for term, gloss in rows)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for row in rows for ch in "".join(row))
    assert len(slang.load(name)) == len(rows)


def test_the_file_header_says_where_the_glossary_comes_from():
    head = resources.files("app.search").joinpath("data", slang.CHINESE).read_text(encoding="utf-8")[:600]
    assert "Hand-written" in head and "NOT derived" in head


def test_malformed_glossaries_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        Glossary.parse(["躺平\t放弃", "躺平\t不想努力"])
    with pytest.raises(ValueError, match="duplicate"):  # the same term once folded to simplified
        Glossary.parse(["離譜\t夸张", "离谱\t荒唐"])
    with pytest.raises(ValueError, match="empty"):
        Glossary.parse(["躺平\t "])
    with pytest.raises(ValueError, match="TAB"):
        Glossary.parse(["躺平 放弃"])
    with pytest.raises(ValueError, match="control"):
        Glossary.parse(["躺平\t放\x00弃"])
    assert len(Glossary.parse(["# a comment", "", "躺平\t放弃"])) == 1


def test_longest_match_wins_and_the_scan_continues_after_it():
    g = Glossary.parse(["吃瓜\t看热闹", "吃瓜群众\t看热闹的人", "群众\t人民"])
    assert g.terms("我们都是吃瓜群众") == ["吃瓜群众"]
    assert g.terms("吃瓜的群众") == ["吃瓜", "群众"]


def test_traditional_full_width_and_spaced_text_matches():
    g = slang.chinese()
    assert g.terms("這也太離譜了") == ["太离谱了"]
    assert "yyds" in g.terms("這個ＹＹＤＳ")  # full-width Latin, upper case
    assert g.terms("我 直接 躺 平") == ["躺平"]  # OCR spaces between Han characters


def test_latin_terms_match_only_as_whole_words():
    g = Glossary.parse(["emo\t情绪低落", "996\t加班", "躺平\t放弃"], latin_needs_han=True)
    assert g.terms("今天好emo啊") == ["emo"]
    assert g.terms("这个demo跑不起来") == []
    assert g.terms("emotion管理") == []
    assert g.terms("19961 号") == []
    assert g.terms("996 躺平") == ["996", "躺平"]


def test_chinese_latin_terms_need_han_text_and_english_ones_do_not():
    assert slang.chinese().terms("gg yyds emo") == []  # an English caption: not Chinese slang
    assert slang.chinese().terms("gg了 yyds") == ["gg", "yyds"]
    assert slang.english().terms("that fit is sus, no cap") == ["sus", "no cap"]
    assert slang.english().terms("sushi") == []


def test_glosses_are_ordered_by_first_appearance_and_deduplicated():
    g = Glossary.parse(["躺平\t放弃努力", "摆烂\t放弃努力", "内卷\t过度竞争", "卷王\t拼命的人"])
    assert g.glosses(["内卷？我选择躺平", "摆烂 内卷", None, ""]) == ["过度竞争", "放弃努力"]
    assert slang.chinese().glosses(["绝绝子", "无关的文字"]) == [slang.chinese().entries["绝绝子"]]


def test_document_version_5_appends_the_glosses_of_slang():
    ctx = {"ocr_text": "我直接躺平", "title": "", "description": "", "tags": ["打工人"]}
    v4 = semantic_document(None, ctx, "4")
    v5 = semantic_document(None, ctx, "5")
    g = slang.chinese()
    assert v5 == v4 + "\n" + g.entries["躺平"] + "；" + g.entries["打工人"]
    assert semantic_document(None, {"ocr_text": "躺平"}, "5").startswith("躺平\n")


@pytest.mark.parametrize("ctx", [
    {"ocr_text": "是我最後的倔強", "title": "倔强"},
    {"ocr_text": "ERROR 404:\n))\nMOTIVATION NOT FOUND\n😂", "title": "404"},
    {"ocr_text": "the demo is sus gg", "tags": ["emo"]},  # Latin slang without Chinese text
    {},
])
def test_document_version_5_without_slang_is_version_4(ctx):
    assert semantic_document("meme.png", ctx, "5") == semantic_document("meme.png", ctx, "4")


def test_version_5_is_the_default_and_queries_are_not_expanded():
    from app.config import Settings

    assert DEFAULT_DOCUMENT_VERSION == Settings().text_document_version == "5"
    assert semantic_query("我直接躺平", "5") == semantic_query("我直接躺平", "4") == "我直接躺平"


def test_ordinary_words_holding_a_term_give_no_gloss():
    g = Glossary.parse(["绝了\t太好了", "凉了\t完了", "!拒绝了", "!天凉了"])
    assert g.terms("他拒绝了我") == []
    assert g.terms("这家店绝了") == ["绝了"]
    assert g.terms("天凉了 这次真凉了") == ["凉了"]
    assert len(g) == 2
    assert slang.chinese().terms("他拒绝了我，天凉了") == []
    with pytest.raises(ValueError, match="both"):
        Glossary.parse(["绝了\t太好了", "!绝了"])
    with pytest.raises(ValueError, match="duplicate"):
        Glossary.parse(["!拒绝了", "!拒絕了"])
