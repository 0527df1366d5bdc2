"""Traditional → simplified Chinese folding: the converter, lexical terms, the semantic document."""

from __future__ import annotations

from importlib import resources

from app.orchestrator.fingerprints import semantic_document, semantic_query
from app.search import lexical
from app.search.hanzi import to_simplified
from bench.search_data import MEMES


def test_traditional_forms_read_by_ocr_fold_to_simplified():
    # PP-OCRv5 output seen on the benchmark (倔強 for 倔强, 減 for 减) and common traditional text
    assert to_simplified("躺平是我最後的倔強") == "躺平是我最后的倔强"
    assert to_simplified("減肥從明天開始") == "减肥从明天开始"
    assert to_simplified("頭髮越來越少，發財靠買彩票") == "头发越来越少，发财靠买彩票"


def test_simplified_latin_and_mixed_text_are_left_as_they_are():
    for meme in MEMES:  # every caption and query of the benchmark is already simplified
        for text in (*meme.lines, meme.exact, meme.paraphrase):
            assert to_simplified(text) == text
    assert to_simplified("Deadline 是第一生产力 996 emo了 yyds 😂") == "Deadline 是第一生产力 996 emo了 yyds 😂"
    assert to_simplified("") == ""


def test_every_conversion_entry_maps_one_character_to_one():
    # highlights cut the original text with spans computed on the folded one
    folder = resources.files("opencc") / "dictionary"
    for name in ("TSPhrases.txt", "TSCharacters.txt"):
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            key, value = line.split("\t")
            assert len(value.split(" ")[0]) == len(key), line


def test_a_traditional_caption_and_a_simplified_query_share_their_terms():
    doc = set(lexical.document_terms(["躺平 / 是我最後的倔強"]))
    assert set(lexical.query_terms("最后的倔强")) <= doc
    # and the other way round: a traditional query finds a simplified caption
    assert set(lexical.query_terms("減肥")) <= set(lexical.document_terms(["减肥从明天开始"]))


def test_highlight_marks_the_original_traditional_text():
    found = lexical.highlight("是我最後的倔強", lexical.query_terms("倔强"))
    assert found == {"text": "是我最後的倔強", "marks": [[5, 7]]}


def test_document_version_3_folds_traditional_chinese_and_keeps_every_line():
    ctx = {"ocr_text": "躺平\n是我最後的倔強\n1 1 11", "title": "躺平", "tags": ["躺平"]}
    assert semantic_document("meme.png", ctx, "3") == "躺平\n是我最后的倔强\n1 1 11"
    assert semantic_document("meme.png", ctx, "2") == "躺平\n是我最後的倔強\n1 1 11"  # as before
    english = {"ocr_text": "ERROR 404:\n))\nMOTIVATION NOT FOUND", "title": "ERROR 404:"}
    assert semantic_document(None, english, "3") == semantic_document(None, english, "2")


def test_document_version_5_is_the_default():  # version 4 plus slang glosses (tests/unit/test_slang.py)
    from app.config import Settings
    from app.orchestrator.fingerprints import DEFAULT_DOCUMENT_VERSION

    assert DEFAULT_DOCUMENT_VERSION == Settings().text_document_version == "5"


def test_document_version_4_also_drops_lines_without_letters():
    ctx = {"ocr_text": "躺平\n是我最後的倔強\n1 1 11", "title": "1 1 11", "tags": ["躺平"]}
    assert semantic_document("meme.png", ctx, "4") == "躺平\n是我最后的倔强"
    ctx = {"ocr_text": "ERROR 404:\n))\nMOTIVATION NOT FOUND\n😂", "title": "404", "description": "", "tags": []}
    assert semantic_document(None, ctx, "4") == "ERROR 404:\nMOTIVATION NOT FOUND\n😂"
    assert semantic_document(None, ctx, "3") == "ERROR 404:\n))\nMOTIVATION NOT FOUND\n😂"  # "404" is in the text
    assert semantic_document(None, {"ocr_text": "1 1 11"}, "4") == ""


def test_queries_are_folded_like_the_documents_of_their_version():
    assert semantic_query("最後的倔強", "3") == semantic_query("最後的倔強", "4") == "最后的倔强"
    assert semantic_query("最後的倔強", "5") == "最后的倔强"
    assert semantic_query("最後的倔強", "2") == "最後的倔強"
    assert semantic_query("Monday again", "3") == "Monday again"


def test_queries_are_nfkc_folded_for_the_models_and_their_routing():
    """A Chinese input method's full-width Latin is the English word for the English-only models,
    and the query is routed like its ASCII form (it counted as a non-Latin script: e5 alone)."""
    from app.search.service import route_weights

    parts = ["multilingual-e5-small", "all-MiniLM-L6-v2"]
    for version in ("3", "4", "5"):
        assert semantic_query("ｍｏｎｄａｙ ａｇａｉｎ ２０２４", version) == "monday again 2024"
        assert semantic_query("ﬁre", version) == "fire"
        assert semantic_query("打工人，加油", version) == "打工人,加油"
    assert semantic_query("ｍｏｎｄａｙ", "2") == "ｍｏｎｄａｙ"  # a pinned version embeds queries as before
    assert route_weights(semantic_query("ｍｏｎｄａｙ ａｇａｉｎ", "5"), parts) == route_weights("monday again", parts)
    assert route_weights(semantic_query("打工人，加油", "5"), parts)["all-MiniLM-L6-v2"] == 0.0


def test_text_without_a_character_t2s_changes_skips_the_converter(monkeypatch):
    """Simplified text is its own conversion: the pure-Python converter (~5 µs a character) is not
    run on it, and mixed text still converts exactly as OpenCC does."""
    import random

    from app.search import hanzi

    converter = hanzi._t2s()
    pool = "躺平是我最后的倔强減肥從明天開始沈默沉船乾隆干燥头发髮彷彿覆盖 abc😂，"
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        assert to_simplified(text) == converter.convert(text), text
    monkeypatch.setattr(hanzi, "_t2s", lambda: (_ for _ in ()).throw(AssertionError("converter run")))
    for meme in MEMES:
        for text in (*meme.lines, meme.exact, meme.paraphrase):
            assert to_simplified(text) == text
    assert to_simplified("抢红包手速太慢了" * 2500) == "抢红包手速太慢了" * 2500
