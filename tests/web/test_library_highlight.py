"""The library page marks exactly the matched words of a search hit's highlight.

The API's ``highlight.marks`` count characters (code points); JavaScript strings count UTF-16
units, in which an emoji or any other character beyond the BMP is two. The page script is run in
node against a minimal DOM (tests/web/js/highlight_harness.js) with the API's own highlights."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from app.search.lexical import highlight

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")


def page_highlights(tmp_path: Path, query: str, texts: list[str]) -> list[dict]:
    hits = [{"image": {"id": f"id-{i}", "sha256": "0" * 64, "display_name": None}, "score": 0.5,
             "highlight": {"field": "ocr_text", **highlight(t, [query])}} for i, t in enumerate(texts)]
    body = tmp_path / "hits.json"
    body.write_text(json.dumps({"items": hits, "mode": "lexical", "coverage": {"ready": 1, "total": 1}}))
    out = subprocess.run([NODE, str(ROOT / "tests/web/js/highlight_harness.js"),
                          str(ROOT / "app/library/static/library.js"), str(body), query],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_marks_land_on_the_matched_word_after_emoji(tmp_path):
    texts = ["cat", "😂😂 the cat sat", "𝐁𝐎𝐋𝐃 🐈 cat 🎉 cat", "猫 cat 😀"]
    shown = page_highlights(tmp_path, "cat", texts)
    for text, hit in zip(texts, shown, strict=True):
        assert hit["text"] == "ocr_text: " + text, hit
        assert hit["marks"] and all(m == "cat" for m in hit["marks"]), (text, hit)
