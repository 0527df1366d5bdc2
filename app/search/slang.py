"""Internet slang → plain words: the glosses ``document_version`` "5" appends to the semantic document.

The offline text models (multilingual-e5-small, all-MiniLM-L6-v2) do not know internet slang: a
caption 我直接躺平 and a query 放弃努力不想奋斗了 say the same thing, but the embeddings of 躺平
and of its meaning lie far apart. A glossary maps each slang term to a short gloss in everyday
words; the document of an image whose text holds slang gets those glosses as one more line
(app/orchestrator/fingerprints.py), so its embedding also carries the plain meaning.

The glossaries (``data/slang_zh.tsv``, ``data/slang_en.tsv``) are hand-written from general
knowledge, blind to the search bench (docs/search.md). Only the Chinese one is used in the
default document: English glosses were measured to lower English paraphrase search.

Matching, on the normalised text (NFKC, traditional → simplified, casefolded, whitespace between
Han characters removed and other whitespace runs made one space): at each position the longest
glossary term wins and the scan continues after it. Chinese has no spaces, so a short term can sit
inside an ordinary word (绝了 in 拒绝了): such words are listed as ``!拒绝了`` and matched like
terms, but give no gloss. A term starting (ending) with a Latin letter
or digit matches only where the text's previous (next) character is not one — ``emo`` is found
in ``好emo啊`` but not in ``demo``. In the Chinese glossary, terms without a Han character (yyds,
996, gg) match only in a text that also holds Han characters: in an English caption they mean
something else, or nothing.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

from app.search.hanzi import to_simplified

_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_HAN_GAP = re.compile("(?<=[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])\\s+(?=[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])")
_SPACES = re.compile(r"\s+")
_DATA = "data"
CHINESE = "slang_zh.tsv"
ENGLISH = "slang_en.tsv"


def normalise(text: str) -> str:
    """The form terms are stored and looked up in (see the module docstring)."""
    text = to_simplified(unicodedata.normalize("NFKC", text)).casefold()
    return _SPACES.sub(" ", _HAN_GAP.sub("", text)).strip()


def _word_char(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


@dataclass(frozen=True)
class Glossary:
    """Normalised term → gloss, with the term lengths per first character (longest first)."""

    entries: Mapping[str, str]
    lengths: Mapping[str, tuple[int, ...]]
    latin_needs_han: bool = False
    # ordinary words holding a shorter term (``!拒绝了`` lines): matched like terms, never glossed
    blocked: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, lines: Iterable[str], *, latin_needs_han: bool = False, source: str = "glossary") -> Glossary:
        """A glossary from ``term<TAB>gloss`` lines (``#`` comments and blank lines skipped) and
        ``!word`` lines (an ordinary word holding a shorter term: consumed, never glossed).

        Raises ValueError on a malformed line, an empty term or gloss, a control character, or a
        term that repeats another once normalised."""
        entries: dict[str, str] = {}
        blocked: set[str] = set()
        for number, raw in enumerate(lines, 1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith("!"):
                word = normalise(line[1:])
                if not word or "\t" in line or any(unicodedata.category(ch) in ("Cc", "Cf") for ch in word):
                    raise ValueError(f"{source}:{number}: malformed !word line")
                if word in blocked:
                    raise ValueError(f"{source}:{number}: duplicate word {line[1:]!r}")
                blocked.add(word)
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ValueError(f"{source}:{number}: expected term<TAB>gloss")
            term, gloss = normalise(parts[0]), " ".join(parts[1].split())
            if not term or not gloss:
                raise ValueError(f"{source}:{number}: empty term or gloss")
            if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in parts[0] + parts[1]):
                raise ValueError(f"{source}:{number}: control character")
            if term in entries:
                raise ValueError(f"{source}:{number}: duplicate term {parts[0]!r}")
            entries[term] = gloss
        if blocked & entries.keys():
            raise ValueError(f"{source}: both a term and a !word: {sorted(blocked & entries.keys())}")
        by_first: dict[str, set[int]] = {}
        for term in (*entries, *blocked):
            by_first.setdefault(term[0], set()).add(len(term))
        lengths = {ch: tuple(sorted(ls, reverse=True)) for ch, ls in by_first.items()}
        return cls(entries, lengths, latin_needs_han, frozenset(blocked))

    def __len__(self) -> int:
        return len(self.entries)

    def terms(self, text: str | None) -> list[str]:
        """The glossary terms found in ``text`` (normalised), in order of first appearance, once each."""
        if not text:
            return []
        s = normalise(text)
        if self.latin_needs_han and _HAN.search(s) is None:
            return []  # no Han: no Han term can match, and Latin/digit terms may not
        found: dict[str, None] = {}
        i, n = 0, len(s)
        while i < n:
            match = self._match_at(s, i)
            if match is None:
                i += 1
                continue
            if match not in self.blocked:
                found.setdefault(match, None)
            i += len(match)
        return list(found)

    def _match_at(self, s: str, i: int) -> str | None:
        lengths = self.lengths.get(s[i])
        if lengths is None or (_word_char(s[i]) and i > 0 and _word_char(s[i - 1])):
            return None
        for length in lengths:
            end = i + length
            if end > len(s):
                continue
            term = s[i:end]
            if (term in self.entries or term in self.blocked) and not (_word_char(term[-1]) and end < len(s) and _word_char(s[end])):
                return term
        return None

    def glosses(self, texts: Iterable[str | None]) -> list[str]:
        """The glosses of the terms found in ``texts`` (each matched on its own), in order of first
        appearance, de-duplicated."""
        out: dict[str, None] = {}
        for text in texts:
            for term in self.terms(text):
                out.setdefault(self.entries[term], None)
        return list(out)


def load(name: str, *, latin_needs_han: bool = False) -> Glossary:
    """The glossary file ``name`` shipped in app/search/data."""
    return _load(name, latin_needs_han)


@functools.cache
def _load(name: str, latin_needs_han: bool) -> Glossary:
    text = resources.files("app.search").joinpath(_DATA, name).read_text(encoding="utf-8")
    return Glossary.parse(text.splitlines(), latin_needs_han=latin_needs_han, source=name)


def chinese() -> Glossary:
    """The Chinese internet-slang glossary (Latin/digit terms only in text with Han characters)."""
    return load(CHINESE, latin_needs_han=True)


def english() -> Glossary:
    """The English internet-slang glossary (not used in the default document)."""
    return load(ENGLISH)
