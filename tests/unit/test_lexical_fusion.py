"""Lexical terms (every script), highlights and hybrid fusion: pure functions."""

from __future__ import annotations

import unicodedata

from app.search import fusion, lexical
from app.search.fusion import Candidate, FusionParams


def test_english_terms_are_stems_without_stopwords():
    assert lexical.query_terms("When the build PASSES on Friday") == ["build", "pass", "friday"]
    assert lexical.document_terms(["Deploying", "deploys"]) == ["deploy", "deploy"]


def test_words_of_other_alphabets_are_terms_as_written_less_optional_marks():
    # case-folded (Greek final sigma too), unstemmed, no stopwords guessed
    assert lexical.query_terms("Кот СМЕЁТСЯ и ΚΟΣΜΟΣ") == ["кот", "смеётся", "и", "κοσμοσ"]
    # Greek accents, Hebrew points, Arabic harakat and tatweel may be left out by the writer
    assert lexical.query_terms("κόσμος") == lexical.query_terms("ΚΟΣΜΟΣ")
    assert lexical.document_terms(["مَرْحَبًا بـــالعالم", "שָׁלוֹם"]) == ["مرحبا", "بالعالم", "שלום"]
    # Devanagari vowel signs are part of the word (stripping them would change it); й stays й
    assert lexical.query_terms("हिंदी भाषा") == ["हिंदी", "भाषा"] and lexical.query_terms("йод") == ["йод"]
    # a word mixing Latin and Cyrillic letters (a homoglyph) is one term, not an English stem
    assert lexical.query_terms("pаypal") == ["pаypal"] and lexical.query_terms("paypal") == ["paypal"]


def test_unspaced_scripts_are_bigrams_whose_units_carry_their_marks():
    doc = lexical.document_terms(["แมวน่ารักมาก"])
    # a tone mark or vowel sign goes with the character before it: no term begins with a mark
    assert all(not unicodedata.category(t[0]).startswith("M") for t in doc), doc
    assert "น่า" in doc and "่า" not in doc
    text = "แมวน่ารักมาก"
    cuts = [i for i in range(len(text) + 1) if i == len(text) or not unicodedata.category(text[i]).startswith("M")]
    for i in cuts[:-1]:  # any substring query (a word never ends before its marks) shares its bigrams
        for j in cuts[cuts.index(i) + 1:]:
            terms = lexical.query_terms(text[i:j])
            assert terms and set(terms) <= set(doc), text[i:j]
    assert lexical.query_terms("่") == []  # a lone mark is no term
    hl = lexical.highlight("ฉันรักแมวน่ารัก", lexical.query_terms("น่ารัก"))
    assert hl == {"text": "ฉันรักแมวน่ารัก", "marks": [[3, 6], [9, 15]]}  # รัก (love) alone too


def test_chinese_runs_become_bigrams_and_documents_also_keep_characters():
    assert lexical.query_terms("抢红包") == ["抢红", "红包"]
    assert lexical.query_terms("油") == ["油"]
    doc = lexical.document_terms(["抢红包手速太慢了"])
    assert {"抢红", "红包", "包手", "慢了"} <= set(doc) and {"抢", "油"} & set(doc) == {"抢"}
    # a query word always shares its bigrams with a caption containing it, wherever it sits
    assert set(lexical.query_terms("手速")) <= set(doc)


def test_mixed_script_full_width_and_case_fold_to_one_form():
    assert lexical.query_terms("ＯＫ 加油 Bug") == ["ok", "加油", "bug"]
    assert lexical.query_terms("加油 加油") == ["加油"]


def test_terms_are_safe_for_the_tsquery_syntax():
    hostile = "a' | b & !c <-> (d) 'e:* \\ 好'"
    for term in lexical.query_terms(hostile):
        assert "'" not in term and " " not in term and "\\" not in term
    assert lexical.tsquery_source(["ab", "好的"]) == "'ab' | '好的'"


def test_emoji_and_punctuation_only_give_no_terms():
    assert lexical.query_terms("😂🔥 !!! ...") == []


def test_highlight_marks_english_words_and_chinese_bigrams():
    hl = lexical.highlight("WHEN THE BUILD PASSES", ["build", "pass"])
    assert hl == {"text": "WHEN THE BUILD PASSES", "marks": [[9, 14], [15, 21]]}
    hl = lexical.highlight("抢红包手速太慢了", ["抢红", "红包"])
    assert hl["marks"] == [[0, 3]]
    assert lexical.highlight("nothing here", ["build"]) is None


def test_highlight_window_of_a_long_text_keeps_the_match():
    text = "word " * 100 + "deploy on friday " + "word " * 100
    hl = lexical.highlight(text, ["deploy"])
    start, end = hl["marks"][0]
    assert hl["text"][start:end] == "deploy" and len(hl["text"]) <= 82


def test_highlight_marks_the_match_when_normalising_shifts_characters_both_ways():
    """NFKC widens a ligature (ﬁ → fi) and joins a combining accent (e + ◌́ → é): the text's
    length is unchanged, yet the characters between the two moved. The marks must still cover
    the matched word, in the text shown."""
    for text in ["ﬁ cat e\u0301", "İ cat e\u0301", "Ⅻ cat"]:
        hl = lexical.highlight(text, ["cat"])
        (start, end), = hl["marks"]
        assert hl["text"][start:end] == "cat", (text, hl)


def test_lexical_score_weighs_rare_terms_more():
    df = {"monday": 40, "coffee": 2}
    assert fusion.lexical_score(["monday", "coffee"], ["monday", "coffee"], df, 100) == 1.0
    rare = fusion.lexical_score(["coffee"], ["monday", "coffee"], df, 100)
    common = fusion.lexical_score(["monday"], ["monday", "coffee"], df, 100)
    assert rare > 0.5 > common > 0


def test_one_edit_apart_means_one_insertion_deletion_substitution_or_swap():
    near = lexical.within_one_edit
    assert near("motivation", "motvation") and near("plans", "dplans") and near("pumpkin", "pumnkin")
    assert near("abcde", "abced") and near("abcde", "abcde") and near("abcd", "axcd")
    assert not near("running", "iinning") and not near("abcd", "badc") and not near("abcdef", "abc")


def test_a_query_word_misread_by_ocr_is_met_one_edit_away_in_long_words_only():
    words = lexical.query_words("Motivation not found")
    assert words == {"motiv": "motivation", "found": "found"}  # "not" is a stopword
    texts = ["ERROR 404:\nMOTVATION NOT FOUND", ""]
    assert lexical.near_terms(words, ["motiv"], texts) == ["motiv"]
    assert lexical.near_terms(words, ["motiv"], ["motivational speaker"]) == []  # two edits
    # short words are one edit from too many others: "cats" never meets "bats"
    assert lexical.near_terms(lexical.query_words("cats"), ["cat"], ["bats"]) == []
    assert lexical.near_terms(lexical.query_words("抢红包"), ["抢红", "红包"], ["抢红色"]) == []  # Latin only


def test_a_near_match_counts_part_of_its_terms_idf():
    df = {"motiv": 0, "found": 1}
    exact = fusion.lexical_score(["found"], ["motiv", "found"], df, 170)
    near = fusion.lexical_score(["found"], ["motiv", "found"], df, 170, ["motiv"], 0.5)
    full = fusion.lexical_score(["found", "motiv"], ["motiv", "found"], df, 170)
    assert exact < near < full == 1.0
    assert abs(near - (exact + 0.5 * (1 - exact))) < 1e-12
    assert fusion.lexical_score(["found"], ["motiv", "found"], df, 170, ["motiv"], 0.0) == exact


def test_a_weak_lexical_match_never_reorders_the_semantic_answer():
    # paraphrase: the right image shares no word; another shares one common word
    cands = [Candidate("right", cosine=0.85, lexical=0.0), Candidate("common-word", cosine=0.84, lexical=0.3)]
    assert [c.image_id for c in fusion.fuse(cands, FusionParams(gate=0.5, weight=0.15))] == ["right", "common-word"]


def test_a_strong_lexical_match_lifts_an_image_above_a_close_semantic_neighbour():
    cands = [Candidate("neighbour", cosine=0.86, lexical=0.2), Candidate("exact", cosine=0.84, lexical=1.0)]
    assert [c.image_id for c in fusion.fuse(cands)] == ["exact", "neighbour"]


def test_an_image_without_an_embedding_yet_still_ranks_by_its_words():
    cands = [Candidate("embedded", cosine=0.5, lexical=0.0), Candidate("new", cosine=None, lexical=1.0)]
    assert [c.image_id for c in fusion.fuse(cands)] == ["new", "embedded"]
    assert [c.image_id for c in fusion.rank_semantic(cands)] == ["embedded"]
    assert [c.image_id for c in fusion.rank_lexical(cands)] == ["new"]


def test_queries_are_routed_by_script_and_scores_read_as_weighted_mean_cosines():
    from app.search.service import LATIN_SPECIALIST_WEIGHT, cosine_scale, route_weights

    parts = ["multilingual-e5-small", "all-MiniLM-L6-v2"]
    assert route_weights("抢红包 ok", parts) == {"multilingual-e5-small": 1.0, "all-MiniLM-L6-v2": 0.0}
    assert route_weights("deploy on friday", parts) == {
        "multilingual-e5-small": 1.0, "all-MiniLM-L6-v2": LATIN_SPECIALIST_WEIGHT}
    assert route_weights("anything", ["all-MiniLM-L6-v2"]) is None
    # any other non-Latin script: the English-only model cannot read it either
    for query in ("кот смеётся", "γάτα", "แมว", "कुत्ता"):
        assert route_weights(query, parts) == {"multilingual-e5-small": 1.0, "all-MiniLM-L6-v2": 0.0}, query
    # Latin letters with accents stay with both models
    assert route_weights("café naïve Straße 2024 😂", parts)["all-MiniLM-L6-v2"] == LATIN_SPECIALIST_WEIGHT
    # the concatenated vector's cosine is Σ wᵢcᵢ / (√k·√Σwᵢ²); scaled, it is Σ wᵢcᵢ / Σ wᵢ
    c, w = [0.8, 0.4], {"a": 1.0, "b": 1.5}
    stored = (1.0 * c[0] + 1.5 * c[1]) / (2 ** 0.5 * (1.0 + 1.5 ** 2) ** 0.5)
    assert abs(stored * cosine_scale(2, w) - (0.8 + 1.5 * 0.4) / 2.5) < 1e-12
    assert abs(0.6 / 2 ** 0.5 * cosine_scale(2, {"a": 1.0, "b": 0.0}) - 0.6) < 1e-12
    assert cosine_scale(2, None) == 1.0


def test_document_terms_equal_the_token_by_token_terms():
    """document_terms' fast path (one regex with groups, memoised word terms) makes exactly the
    terms of ``tokens`` + ``word_term`` / ``run_terms``."""
    from app.search import lexical

    def reference(texts):
        out = []
        for text in texts:
            for tok in lexical.tokens(text or ""):
                if tok.run:
                    out.extend(lexical.run_terms(tok.text, query=False))
                elif (term := lexical.word_term(tok.text)) is not None:
                    out.append(term)
        return out

    texts = [
        "A square 16x16 image, mostly dark red (#8a1010) with bright green accents; the passes it's",
        "当你 抢红包手速太慢了 when the meme is too REAL lol 2024", "倔強的貓 ＦＵＬＬ－ＷＩＤＴＨ ｔｅｘｔ ２０２４",
        "snake_case words_with_underscores and o'clock ’quoted’ don't", "日本語のテキスト 한국어 텍스트 café naïve Straße",
        "", None, "a", "的", "x" * 40, "emoji 😀 mixed 中文English混排 ok", "ﬁne ligature ①②",
        "Кот СМЕЁТСЯ над ΚΌΣΜΟΣ", "مَرْحَبًا بـــالعالم שָׁלוֹם", "हिंदी भाषा", "แมวน่ารักมาก ່ขึ้น", "ឆ្មា pаypal",
    ]
    for i in range(len(texts)):
        assert lexical.document_terms(texts[i:i + 3]) == reference(texts[i:i + 3]), texts[i:i + 3]


def test_a_hits_highlight_normalises_a_bounded_amount_of_its_text(monkeypatch):
    """Normalising Chinese text costs ~5 µs a character (OpenCC): a search of 100 hits, each with
    20k characters of OCR text, spent 20-40 s making highlights. A hit's fields now share a bounded
    scan (a short title after a long OCR text is still searched), and each is normalised once."""
    from app.search import service

    seen: list[int] = []
    real = lexical.normalise
    monkeypatch.setattr(lexical, "normalise", lambda text: seen.append(len(text)) or real(text))
    ocr = "抢红包手速太慢了打工人摸鱼" * 1600  # 20,800 characters without the query's words
    image = {"display_name": "x", "context": {"ocr_text": ocr, "title": "周五 加油", "tags": ["加油"]}}
    hl = service._highlight(image, ["加油"])
    assert hl["field"] == "title" and [hl["text"][s:e] for s, e in hl["marks"]] == ["加油"]
    assert sum(seen) <= lexical.HIGHLIGHT_SCAN_CHARS + 500, seen


def test_highlight_scans_the_first_characters_only_and_never_marks_a_cut_word():
    text = "x " * 100 + "cats " + "deploy " * 10
    hl = lexical.highlight(text, ["cat"], scan=203)  # "cat|s": cut by the scan limit
    assert hl is None
    hl = lexical.highlight(text, ["cat"], scan=210)
    (start, end), = hl["marks"]
    assert hl["text"][start:end] == "cats" and hl["text"].endswith("…")
    assert lexical.highlight(text, ["deploy"], scan=150) is None
    # a word that ends exactly at the limit is whole: marked, and the text goes on ("…")
    hl = lexical.highlight(text, ["cat"], scan=204)
    (start, end), = hl["marks"]
    assert hl["text"][start:end] == "cats" and hl["text"].endswith("…")


def test_highlight_marks_a_chinese_or_thai_run_the_scan_limit_cut():
    """A run of a script without spaces may be thousands of characters long: the scan cutting it
    leaves its bigrams before the cut whole (only a character cut from its marks is no match)."""
    from app.search import service

    ocr = "抢红包手速太慢了打工人摸鱼" * 1600  # one run of 20,800 characters
    hl = service._highlight({"display_name": "x", "context": {"ocr_text": ocr}}, ["红包"])
    assert hl["field"] == "ocr_text" and hl["marks"][0] == [1, 3], hl
    hl = lexical.highlight("ภาษาไทย" * 1000, ["ภา"])
    assert hl is not None and hl["text"][slice(*hl["marks"][0])] == "ภา"
    hl = lexical.highlight("中文字", ["中文"], scan=2)
    assert [hl["text"][s:e] for s, e in hl["marks"]] == ["中文"]
    # the scan ends between a Thai letter and its vowel mark: that letter is no match, the one before is
    assert lexical.highlight("ab ขกั", ["ขก"], scan=5) is None
    assert lexical.highlight("ab ขกั", ["ข"], scan=5)["marks"] == [[3, 4]]
    # nor is a Latin word cut before its combining accent
    assert lexical.highlight("cafe\u0301 x", ["cafe"], scan=4) is None


def test_near_terms_index_answers_as_every_pair_compared():
    """The one-edit index finds exactly the query words ``within_one_edit`` of some text word."""
    import random

    rnd = random.Random(7)
    for _ in range(300):
        qwords = {"".join(rnd.choices("abc", k=rnd.randint(5, 7))) for _ in range(rnd.randint(1, 4))}
        words = {f"t{i}": w for i, w in enumerate(sorted(qwords))}
        texts = [" ".join("".join(rnd.choices("abc", k=rnd.randint(4, 8))) for _ in range(rnd.randint(0, 12)))]
        doc = lexical._words(texts)
        expected = [t for t, w in words.items() if any(lexical.within_one_edit(w, d) for d in doc)]
        assert lexical.near_terms(words, list(words), texts) == expected, (words, texts)


def test_near_terms_of_a_search_read_a_bounded_amount_of_each_candidates_text(monkeypatch):
    """A hybrid search looks for near words in up to 200 candidates. Their stored fields may hold
    what PATCH accepts (a 20k OCR text, a 10k description, ...), here all distinct five-letter
    words, and a query may bring 32 five-letter words none of which matches exactly: comparing
    every pair took tens of seconds of an API worker per search. Counted, not timed: each text
    word within the scan is looked up once, whatever the query's size, and no pair is compared."""
    import random
    import string

    rnd = random.Random(1)
    pool = sorted({"".join(rnd.choices(string.ascii_lowercase, k=5)) for _ in range(7500)})[:6800]
    ctx = {"ocr_text": " ".join(pool[:3333]), "description": " ".join(pool[3333:5000]),
           "title": " ".join(pool[5000:5083]), "tags": pool[5083:5183]}
    query = " ".join("".join(rnd.choices(string.ascii_lowercase, k=5)) for _ in range(32))
    words, terms = lexical.query_words(query), lexical.query_terms(query)
    fields = lexical.lexical_fields("name", ctx)
    looked_up, compared = [], []
    real_lookup = lexical._OneEditIndex.terms_near
    monkeypatch.setattr(lexical._OneEditIndex, "terms_near", lambda self, x: looked_up.append(x) or real_lookup(self, x))
    monkeypatch.setattr(lexical, "within_one_edit", lambda *a: compared.append(a) or False)
    lexical.near_terms(words, terms, fields)
    assert compared == []
    # five letters and a separator per word: at most the scan's worth of words (the fields share
    # NEAR_SCAN_CHARS, each gets at least NEAR_FIELD_MIN), each looked up once
    scan = lexical.NEAR_SCAN_CHARS + len(fields) * lexical.NEAR_FIELD_MIN
    assert 0 < len(looked_up) <= scan // 6 + len(fields), len(looked_up)


def test_near_terms_never_meet_a_word_the_scan_limit_cut():
    far = "x " * (lexical.NEAR_SCAN_CHARS // 2 - 3)
    words = lexical.query_words("motivation")
    assert lexical.near_terms(words, ["motiv"], [far + "motvation"]) == []  # past the scan
    assert lexical.near_terms(words, ["motiv"], [far[:-6] + "motvation"]) == ["motiv"]
    # "motivationless" cut to "motivatio" would be one edit away: a cut word is no word
    head = "x " * (lexical.NEAR_SCAN_CHARS // 2 - 6) + "yy "
    assert len(head) == lexical.NEAR_SCAN_CHARS - len("motivatio")
    assert lexical.near_terms(words, ["motiv"], [head + "motivationless"]) == []
