"""Lexical search: current text only, written with the context, scope-filtered, index-driven."""

from __future__ import annotations

import io
import random
import unicodedata

from sqlalchemy import text

from app.search import lexical
from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers


def _search(client, q: str, mode: str = "lexical", headers: dict | None = None) -> list[str]:
    r = client.get("/api/v1/search/text", query_string={"q": q, "mode": mode}, headers=headers or {})
    assert r.status_code == 200, r.get_json()
    return [h["image"]["id"] for h in r.get_json()["items"]]


def test_agent_context_terms_are_searchable_and_leave_with_the_bytes(client, orch, publisher):
    with Workers(orch, publisher, n=1):
        body = upload(client, png_bytes((10, 200, 10), size=(40, 40)), display_name="frog photo").get_json()
        image = body["image"]["id"]
        wait_job(client, body["job"]["id"])
    # the deterministic agent's title is "40x40 still image": written with the context
    assert _search(client, "still image") == [image]
    assert _search(client, "frog") == [image]
    # new bytes: the old context no longer describes the image — only its name is still its text
    r = client.put(f"/api/v1/images/{image}/content",
                   data={"file": (io.BytesIO(png_bytes((1, 2, 3), size=(40, 40))), "n.png")},
                   content_type="multipart/form-data")
    assert r.status_code == 200, r.get_json()
    assert _search(client, "still image") == []
    assert _search(client, "frog") == [image]


def test_edited_chinese_context_is_found_by_any_word_of_it(client):
    image = upload(client, png_bytes((9, 9, 9)), process=False).get_json()["image"]["id"]
    other = upload(client, png_bytes((8, 8, 8)), process=False).get_json()["image"]["id"]
    client.patch(f"/api/v1/images/{image}", json={"context": {"ocr_text": "抢红包手速太慢了"}})
    client.patch(f"/api/v1/images/{other}", json={"context": {"ocr_text": "今天也要加油"}})
    assert _search(client, "抢红包") == [image]
    assert _search(client, "手速") == [image]
    assert _search(client, "加油") == [other]
    out = client.get("/api/v1/search/text", query_string={"q": "红包", "mode": "lexical"}).get_json()
    hit = out["items"][0]
    assert hit["highlight"] == {"field": "ocr_text", "text": "抢红包手速太慢了", "marks": [[1, 3]]}
    assert hit["matched"]["lexical"] == {"rank": 1, "score": 1.0, "terms": ["红包"]}
    assert out["lexical"]["terms"] == ["红包"]


def test_a_word_misread_by_ocr_still_counts_half_when_one_edit_away(client):
    misread = upload(client, png_bytes((9, 9, 9)), process=False).get_json()["image"]["id"]
    other = upload(client, png_bytes((8, 8, 8)), process=False).get_json()["image"]["id"]
    client.patch(f"/api/v1/images/{misread}", json={"context": {"ocr_text": "ERROR 404:\nMOTVATION NOT FOUND"}})
    client.patch(f"/api/v1/images/{other}", json={"context": {"ocr_text": "motivation is overrated"}})
    out = client.get("/api/v1/search/text", query_string={"q": "motivation found", "mode": "lexical"}).get_json()
    hits = {h["image"]["id"]: h for h in out["items"]}
    assert [h["image"]["id"] for h in out["items"]] == [misread, other]  # both terms equally rare
    assert hits[misread]["matched"]["lexical"]["terms"] == ["found"]
    assert hits[misread]["matched"]["near"] == {"terms": ["motiv"], "lexical_score": 0.75}
    assert hits[other]["matched"]["lexical"]["score"] == 0.5 and "near" not in hits[other]["matched"]


def test_lexical_search_never_crosses_scopes(token_app, tokens):
    token_client = token_app.test_client()

    def auth(scope):
        return {"Authorization": f"Bearer {tokens[scope]}"}

    a = upload(token_client, png_bytes((1, 1, 1)), process=False, headers=auth("alpha")).get_json()["image"]["id"]
    b = upload(token_client, png_bytes((2, 2, 2)), process=False, headers=auth("beta")).get_json()["image"]["id"]
    for image, scope in ((a, "alpha"), (b, "beta")):
        r = token_client.patch(f"/api/v1/images/{image}", json={"context": {"title": "shared secret words"}},
                               headers=auth(scope))
        assert r.status_code == 200
    assert _search(token_client, "secret words", headers=auth("alpha")) == [a]
    assert _search(token_client, "secret words", mode="hybrid", headers=auth("beta")) == [b]


def test_the_lexical_lookup_is_one_scope_led_gin_index_scan(engine):
    terms = lexical.query_terms("build passes 红包")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('local', gen_random_uuid())"))
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " search_tsv) SELECT gen_random_uuid(), 'local', md5(g::text), '.png', 'image/png', 1, 1, 1, 'k' || g,"
            " to_tsvector('simple', 'word' || g) FROM generate_series(1, 3000) g"))
        conn.execute(text("ANALYZE images"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in conn.execute(
            text("EXPLAIN SELECT i.id FROM images i WHERE i.scope_id = 'local'"
                 " AND i.search_tsv @@ to_tsquery('simple', :q)"),
            {"q": lexical.tsquery_source(terms)}))
    assert "ix_images_search_tsv" in plan, plan
    assert "scope_id" in plan.split("Index Cond:")[1], plan  # the scope is part of the index scan


def test_traditional_and_simplified_chinese_find_each_other(client):
    # OCR may read a simplified caption in traditional form (倔強), and users type either form
    read_traditional = upload(client, png_bytes((7, 7, 7)), process=False).get_json()["image"]["id"]
    simplified = upload(client, png_bytes((6, 6, 6)), process=False).get_json()["image"]["id"]
    client.patch(f"/api/v1/images/{read_traditional}", json={"context": {"ocr_text": "躺平\n是我最後的倔強"}})
    client.patch(f"/api/v1/images/{simplified}", json={"context": {"ocr_text": "减肥从明天开始"}})
    assert _search(client, "最后的倔强") == [read_traditional]
    assert _search(client, "減肥") == [simplified]
    r = client.get("/api/v1/search/text", query_string={"q": "倔强", "mode": "lexical"}).get_json()
    # the highlight marks the stored (traditional) text itself
    assert r["items"][0]["highlight"] == {"field": "ocr_text", "text": "躺平 / 是我最後的倔強", "marks": [[10, 12]]}


def test_words_of_other_alphabets_and_unspaced_scripts_are_found(client, engine):
    """Cyrillic, Greek, Arabic, Devanagari words are terms (case-folded; Greek accents and Arabic
    harakat optional); Thai, written without spaces, is found by any word of it, as Chinese is."""
    texts = {
        "ru": "Кот СМЕЁТСЯ над собакой", "el": "Ο ΚΌΣΜΟΣ ΜΑΣ", "ar": "مَرْحَبًا بالعالم",
        "hi": "हिंदी भाषा बहुत सुंदर है", "th": "แมวน่ารักมาก", "km": "ឆ្មាគួរឱ្យស្រឡាញ់", "en": "a cat laughs at the dog",
    }
    ids = {}
    for i, (lang, ocr) in enumerate(texts.items()):
        ids[lang] = upload(client, png_bytes((i, 3, 3)), process=False).get_json()["image"]["id"]
        r = client.patch(f"/api/v1/images/{ids[lang]}", json={"context": {"ocr_text": ocr}})
        assert r.status_code == 200, r.get_json()
    assert _search(client, "смеётся") == [ids["ru"]]
    assert _search(client, "кот") == [ids["ru"]]
    assert _search(client, "κοσμος") == [ids["el"]]  # no accent, final sigma: the same term
    assert _search(client, "مرحبا") == [ids["ar"]]  # unpointed
    assert _search(client, "सुंदर") == [ids["hi"]]  # the vowel signs stay in the word
    assert _search(client, "น่ารัก") == [ids["th"]]
    assert _search(client, "ស្រឡាញ់") == [ids["km"]]
    assert _search(client, "cat") == [ids["en"]]
    hit = client.get("/api/v1/search/text", query_string={"q": "смеётся", "mode": "lexical"}).get_json()["items"][0]
    assert hit["highlight"] == {"field": "ocr_text", "text": texts["ru"], "marks": [[4, 11]]}
    with engine.connect() as conn:  # each term is one lexeme under the cluster's locale: no split
        for ocr in texts.values():
            terms = lexical.document_terms([ocr])
            lexemes = conn.execute(text("SELECT array_length(tsvector_to_array(to_tsvector('simple', :t)), 1)"),
                                   {"t": lexical.tsvector_source(terms)}).scalar()
            assert lexemes == len(set(terms)), (ocr, terms)


def test_queries_of_random_scripts_never_fail(client):
    """Letters, marks, digits, punctuation and symbols of any plane, in any mix: PostgreSQL's parser
    drops some of them from a term (a digit sign, a Thai punctuation mark) — the search still
    answers 200, and a term it keeps still finds its document."""
    rng = random.Random(3)
    pool = [chr(c) for c in range(0x20, 0x30000)
            if unicodedata.category(chr(c))[0] in "LMNPSZ" and not 0xD800 <= c < 0xE000]
    image = upload(client, png_bytes((9, 9, 9)), process=False).get_json()["image"]["id"]
    client.patch(f"/api/v1/images/{image}", json={"context": {"ocr_text": "cat ❽ ๚鱍 ・守 Ꮔ"}})
    for q in ["❽ cat", "❽", "๚", "・", "Ꮔ", "ꮔ", "守"]:
        r = client.get("/api/v1/search/text", query_string={"q": q, "mode": "lexical"})
        assert r.status_code == 200, r.get_json()
        assert [h["image"]["id"] for h in r.get_json()["items"]] == ([] if q in ("❽", "๚", "・") else [image]), q
    for _ in range(150):
        q = "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        for mode in ("lexical", "hybrid"):
            r = client.get("/api/v1/search/text", query_string={"q": q, "mode": mode})
            assert r.status_code in (200, 422), (q, mode, r.get_json())


def test_semantic_queries_are_folded_like_the_documents(client, orch, publisher):
    """Document versions 3 and later (5 is the default): the query is embedded in simplified form, so a
    traditional query scores exactly as its simplified twin against the (simplified) document."""
    image = upload(client, png_bytes((5, 5, 5)), process=False).get_json()["image"]["id"]
    client.patch(f"/api/v1/images/{image}", json={"context": {"ocr_text": "躺平\n是我最後的倔強"}})
    with Workers(orch, publisher, n=1):
        r = client.post(f"/api/v1/images/{image}/process", json={})
        assert r.status_code in (200, 201, 202), r.get_json()
        wait_job(client, r.get_json()["job"]["id"])

    def scores(q):
        r = client.get("/api/v1/search/text", query_string={"q": q, "mode": "semantic"})
        assert r.status_code == 200, r.get_json()
        return [(h["image"]["id"], h["score"]) for h in r.get_json()["items"]]

    folded = scores("是我最后的倔强")  # the deterministic provider hashes whole words
    # 1/√5: the document's five words are the caption's two and version 5's three-word gloss of 躺平
    assert folded and folded[0][0] == image and folded[0][1] > 0.4
    assert scores("是我最後的倔強") == folded
