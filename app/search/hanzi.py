"""Traditional → simplified Chinese: one written form for documents, queries and lexical terms.

The same caption can reach search in two written forms: PP-OCRv5's recogniser often reads a
simplified caption with traditional characters (倔強 for 倔强, 減 for 减), and users in Hong
Kong or Taiwan type traditional queries. Neither the lexical bigrams nor e5 treat 強 and 强
as the same character, so both sides are folded to simplified before terms are made or text
is embedded (``document_version`` "3", app/orchestrator/fingerprints.py).

The conversion is OpenCC's ``t2s`` (phrases first, then characters) from
``opencc-python-reimplemented`` (pure Python, Apache-2.0, dictionaries inside the wheel, no
network). Simplified text is left unchanged (checked on every benchmark caption and query),
Latin text never changes, and the conversion maps characters one to one, so spans computed on
the converted text still fit the original (highlights rely on that).
"""

from __future__ import annotations

import re
import threading
from typing import Any

# Han ideographs (unified, extension A, compatibility) — the only characters t2s changes.
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_lock = threading.Lock()
_converter: Any = None


def _t2s() -> Any:
    global _converter
    if _converter is None:
        with _lock:
            if _converter is None:
                import opencc  # opencc-python-reimplemented

                converter = opencc.OpenCC("t2s")
                converter.convert("測試")  # load the dictionaries now, under the lock
                _converter = converter
    return _converter


def _changeable() -> re.Pattern[str]:
    """The characters t2s may change: those its character and phrase tables map to another (a
    phrase only matches text that holds all of its characters, the changed ones included). Text
    with none of them is its own conversion."""
    global _changes
    if _changes is None:
        from importlib import resources

        chars: set[str] = set()
        folder = resources.files("opencc") / "dictionary"
        for name in ("TSCharacters.txt", "TSPhrases.txt"):
            for line in (folder / name).read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("\t")
                first = value.split(" ")[0]
                chars.update(k for k, v in zip(key, first, strict=False) if k != v)
                if len(first) != len(key):  # never so far (test_hanzi): then any of its characters
                    chars.update(key)
        _changes = re.compile("[" + "".join(re.escape(c) for c in sorted(chars)) + "]")
    return _changes


_changes: re.Pattern[str] | None = None


def to_simplified(text: str) -> str:
    """``text`` with traditional Chinese characters in simplified form (other text unchanged).

    Text without a character t2s may change (simplified Chinese, nearly every caption) skips the
    converter, which costs ~5 µs a character (pure Python): one regex search instead.
    Thread-safe: after loading, OpenCC's ``convert`` keeps no state between calls."""
    if not text or _HAN.search(text) is None or _changeable().search(text) is None:
        return text
    out = _t2s().convert(text)
    # every t2s entry maps one character to one (tests/unit/test_hanzi.py checks the
    # dictionaries); should a future one not, the text is kept as it was
    return out if len(out) == len(text) else text


def converter_version() -> str:
    """The installed converter and its version (for docs and configs)."""
    from importlib import metadata

    try:
        return f"opencc-python-reimplemented=={metadata.version('opencc-python-reimplemented')}"
    except metadata.PackageNotFoundError:  # pragma: no cover - a required dependency
        return "opencc-python-reimplemented==missing"
