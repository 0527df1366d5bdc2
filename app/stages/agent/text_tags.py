"""Reading order and salient-word extraction for OCR output (pure functions, no model)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Small English stopword list: enough to keep tags meaningful without an NLP dependency.
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "im",
        "dont",
        "its",
        "thats",
    ]
)

_TOKEN = re.compile(
    r"[A-Za-z][A-Za-z0-9'’]*"  # Latin words
    r"|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"  # CJK runs
)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclass(frozen=True)
class TextBox:
    """One recognised text fragment with its axis-aligned bounds."""

    text: str
    left: float
    top: float
    right: float
    bottom: float
    score: float

    @property
    def height(self) -> float:
        return self.bottom - self.top

    @property
    def centre_y(self) -> float:
        return (self.top + self.bottom) / 2


def group_lines(boxes: list[TextBox]) -> list[list[TextBox]]:
    """Group boxes into visual lines, top to bottom, each line left to right."""
    lines: list[list[TextBox]] = []
    for box in sorted(boxes, key=lambda b: (b.centre_y, b.left)):
        if lines:
            line = lines[-1]
            line_centre = sum(b.centre_y for b in line) / len(line)
            line_height = max(b.height for b in line)
            if abs(box.centre_y - line_centre) <= 0.5 * min(line_height, box.height):
                line.append(box)
                continue
        lines.append([box])
    return [sorted(line, key=lambda b: b.left) for line in lines]


def line_text(line: list[TextBox]) -> str:
    """Join one line's fragments; CJK fragments next to each other need no space."""
    out = ""
    for box in line:
        text = box.text.strip()
        if out and not (_CJK.search(out[-1]) and _CJK.match(text)):
            out += " "
        out += text
    return out


def salient_words(lines: list[list[TextBox]], limit: int | None = 10) -> list[str]:
    """Lower-cased, de-duplicated, stopword-free words; words in taller text rank first (at most
    ``limit``; None: all).

    Chinese has no spaces to split words on, so a CJK tag is a run of CJK characters as read
    (usually a whole caption line).
    """
    ranked: dict[str, tuple[float, int]] = {}
    order = 0
    for line in lines:
        for box in line:
            for token in _TOKEN.findall(box.text):
                word = token.lower().strip("'’")
                # Latin words of 3+ letters; CJK runs of 2+ characters (a lone 了 or 的 says
                # nothing a search would look for).
                if word in STOPWORDS or len(word) < (2 if _CJK.match(word) else 3):
                    continue
                best = ranked.get(word)
                if best is None or -box.height < best[0]:
                    ranked[word] = (-box.height, best[1] if best else order)
                order += 1
    return [word for word, _ in sorted(ranked.items(), key=lambda item: item[1])][:limit]
