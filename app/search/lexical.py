"""Lexical terms for text in any script: one normaliser for documents, queries and highlights.

PostgreSQL's parsers do not segment Chinese (a caption like 抢红包手速太慢了 is one token), so the
terms are made here and stored as a ``simple`` tsvector (no further processing in the database):

- text is NFKC-normalised (full-width forms → ASCII), case-folded (``ΚΟΣΜΟΣ`` and ``κοσμος``,
  ``STRASSE`` and ``straße`` meet), and traditional Chinese characters are folded to simplified
  (app/search/hanzi.py: OCR reads 倔强 as 倔強, users type either form);
- a Latin/digit word becomes its Snowball English stem (``passes`` → ``pass``); English stopwords
  are dropped;
- a word of another alphabet (Cyrillic, Greek, Arabic, Hebrew, Devanagari …; combining marks are
  part of the word) is its own term, unstemmed: no stemmer or stopword list is guessed for it;
- a run of a script written without spaces between words — Han, kana, hangul (syllable blocks),
  Thai, Lao, Khmer, Myanmar — becomes its character bigrams: robust without a dictionary, since a
  query word always shares its bigrams with the text that contains it, whatever a segmenter would
  have made of either; plus, in documents, its single characters (so a one-character query still
  matches). A query uses bigrams, or the character itself when the run is one character long.

Everything is pure Python and deterministic; the same function renders a document's terms when
its context is written and a query's terms when it is searched. Changing what it renders changes
stored terms: a migration re-makes them (migrations/versions/0019, 0024).
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import snowballstemmer

from app.search.hanzi import to_simplified
from app.stages.agent.text_tags import STOPWORDS

#: Han, kana and hangul: what ``has_cjk`` looks for.
_CJK_CLASS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
#: Scripts indexed as character bigrams: CJK, and Thai, Lao, Myanmar and Khmer (no spaces between words).
_RUN_CLASS = _CJK_CLASS + "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
_RUN_CHAR = re.compile(f"[{_RUN_CLASS}]")


def _mark_classes() -> tuple[str, str]:
    """Character classes of every combining mark (Unicode category M*) outside ``_RUN_CLASS`` and
    inside it. Outside, vowel signs and diacritics that NFKC leaves apart (Devanagari, Arabic,
    Hebrew …) belong to their word; inside, a Thai tone mark belongs to the character before it.
    Built once, at import, from ``unicodedata`` (50–100 ms here): ``re`` has no ``\\p{M}``."""
    ranges: dict[bool, list[list[int]]] = {False: [], True: []}
    for cp in [*range(0x20000), *range(0xE0100, 0xE01F0)]:
        if unicodedata.category(chr(cp)).startswith("M"):
            into = ranges[bool(_RUN_CHAR.match(chr(cp)))]
            if into and into[-1][1] == cp - 1:
                into[-1][1] = cp
            else:
                into.append([cp, cp])
    return tuple("".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges[inside]) for inside in (False, True))


_MARKS, _RUN_MARKS = _mark_classes()
#: A word: a letter or digit outside the bigram scripts, then letters, digits and combining marks.
_WORD = rf"[^\W_{_RUN_CLASS}]+(?:[{_MARKS}]+[^\W_{_RUN_CLASS}]*)*"
_TOKEN = re.compile(rf"[{_RUN_CLASS}]+|{_WORD}", re.UNICODE)
_RUN = re.compile(rf"[{_RUN_CLASS}]+")
_RUN_MARK = re.compile(f"[{_RUN_MARKS}]")
#: A unit of a run: a character with the marks after it (marks that begin a run belong to nothing).
_RUN_UNIT = re.compile(f"[^{_RUN_MARKS}][{_RUN_MARKS}]*")
_CJK_RUN = re.compile(rf"[{_CJK_CLASS}]+")
_LATIN_OK = re.compile(r"^[0-9a-z\u00c0-\u024f]+$")
#: Letters of no Latin range (ASCII, Latin-1 to Latin Extended-B, Latin Extended Additional).
_NON_LATIN_LETTER = re.compile(r"[^\W\d_a-zA-Z\u00c0-\u024f\u1e00-\u1eff]")
MAX_QUERY_TERMS = 32
_stemmers = threading.local()


@functools.lru_cache(maxsize=65536)  # words repeat (Zipf): the Snowball stemmer was ~10 % of a worker's CPU
def _stem(word: str) -> str:
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:  # snowballstemmer objects are not thread-safe: one per thread
        stemmer = _stemmers.english = snowballstemmer.stemmer("english")
    return stemmer.stemWord(word)


def normalise(text: str) -> str:
    """NFKC + case folding + traditional → simplified: the form every term and highlight is
    computed on. Changing it changes stored terms: a migration re-makes them (0019, 0024)."""
    return to_simplified(unicodedata.normalize("NFKC", text).casefold())


@dataclass(frozen=True)
class Token:
    """One word or bigram-script run of a text, with its span in the *normalised* text."""

    text: str
    start: int
    end: int
    run: bool  # a run of a bigram script (CJK, Thai …), not a word


def tokens(text: str) -> Iterator[Token]:
    """Words and bigram-script runs of ``normalise(text)``, in order."""
    return _normalised_tokens(normalise(text))


def _normalised_tokens(norm: str) -> Iterator[Token]:
    for m in _TOKEN.finditer(norm):
        yield Token(m.group(), m.start(), m.end(), bool(_RUN.fullmatch(m.group())))


#: Marks a writer may leave out: Greek accents and diaeresis, Hebrew points, Arabic harakat (and the
#: tatweel stretch): a word has one term with or without them, as common search analysers do.
_OPTIONAL_MARKS = re.compile("[\u0300-\u036f\u0591-\u05c7\u0610-\u061a\u0640\u064b-\u065f\u0670\u06d6-\u06ed]")
_POINTED_SCRIPT = re.compile("[\u0370-\u03ff\u1f00-\u1fff\u0590-\u06ff]")


def word_term(word: str) -> str | None:
    """A word's term: a Latin/digit word's English stem (None for a stopword); a word of another
    alphabet as it is — no stemmer or stopword list is guessed for it — less the marks its script
    may leave out (Greek, Hebrew, Arabic: ``_OPTIONAL_MARKS``)."""
    word = word.strip("'’")
    if not word:
        return None
    if _LATIN_OK.match(word):
        return None if word in STOPWORDS else _stem(word)
    if _POINTED_SCRIPT.search(word):
        word = unicodedata.normalize("NFC", _OPTIONAL_MARKS.sub("", unicodedata.normalize("NFD", word))) or None
    return word


def run_terms(run: str, *, query: bool) -> list[str]:
    """Bigrams of a bigram-script run (+ its characters for documents; a 1-char query run is
    itself). A character's combining marks go with it (``_RUN_UNIT``): no term begins with a mark,
    which PostgreSQL's parser would split off as a blank."""
    if _RUN_MARK.search(run):
        units = _RUN_UNIT.findall(run)
        if len(units) <= 1:
            return units
        grams = [units[i] + units[i + 1] for i in range(len(units) - 1)]
        return grams if query else grams + units
    if len(run) == 1:
        return [run]
    grams = [run[i:i + 2] for i in range(len(run) - 1)]
    return grams if query else grams + list(run)


#: ``_TOKEN`` with its branches as groups: (run, "") or ("", word) per match.
_DOC_TOKEN = re.compile(rf"([{_RUN_CLASS}]+)|({_WORD})", re.UNICODE)
#: A word's term, memoised: words repeat, and this is on every agent completion's path.
_word_term_cached = functools.lru_cache(maxsize=65536)(word_term)


def document_terms(texts: Iterable[str | None]) -> list[str]:
    """The terms of a document made of several fields (duplicates kept: they are term counts).
    The same terms as ``tokens`` + ``word_term``/``run_terms``, without a Token per word."""
    out: list[str] = []
    for text in texts:
        if not text:
            continue
        for run, word in _DOC_TOKEN.findall(normalise(text)):
            if run:
                out.extend(run_terms(run, query=False))
            else:
                term = _word_term_cached(word)
                if term:
                    out.append(term)
    return out


def query_terms(query: str) -> list[str]:
    """Distinct terms of a query, in order, at most MAX_QUERY_TERMS."""
    seen: dict[str, None] = {}
    for tok in tokens(query):
        terms = run_terms(tok.text, query=True) if tok.run else [t for t in [word_term(tok.text)] if t]
        for term in terms:
            seen.setdefault(term, None)
    return list(seen)[:MAX_QUERY_TERMS]


def tsvector_source(terms: list[str]) -> str:
    """The text handed to ``to_tsvector('simple', …)``: terms are word characters only, so the
    simple parser keeps each one as exactly one lexeme."""
    return " ".join(terms)


def tsquery_source(terms: list[str]) -> str:
    """An OR tsquery of the terms (each quoted; terms contain no quote characters)."""
    return " | ".join(f"'{t}'" for t in terms)


def lexical_fields(display_name: str | None, context: dict | None) -> list[str]:
    """The fields of an image that lexical search reads: display name, title, OCR text,
    description and tags (the human-edited ones included — they are the context)."""
    ctx = context or {}
    tags = ctx.get("tags") or []
    return [
        display_name or "",
        str(ctx.get("title") or ""),
        str(ctx.get("ocr_text") or ""),
        str(ctx.get("description") or ""),
        " ".join(str(t) for t in tags) if isinstance(tags, list) else str(tags),
    ]


def image_terms(display_name: str | None, context: dict | None) -> str:
    """``tsvector_source`` of an image's current text (what the store writes with the context)."""
    return tsvector_source(document_terms(lexical_fields(display_name, context)))


#: Characters of a search hit's text fields searched for its highlight, at most: normalising Chinese
#: text (OpenCC, pure Python) costs ~5 µs a character, and a hit's fields may hold 40k of them —
#: without a bound one search of 100 such hits took 20–40 s of an API worker.
HIGHLIGHT_SCAN_CHARS = 4000


def highlight(text: str, terms: Iterable[str], *, width: int = 80, scan: int = HIGHLIGHT_SCAN_CHARS) -> dict | None:
    """A short window of ``text`` around its matches of ``terms`` (query terms that matched),
    found in the first ``scan`` characters of ``text``.

    Returns ``{"text": snippet, "marks": [[start, end], …]}`` with spans in the snippet (marks
    merged where adjacent), or None when nothing there matches.
    """
    wanted = set(terms)
    if not text or not wanted or scan <= 0:
        return None
    longer = len(text) > scan
    # the scan ends inside a word or run: before a letter, a digit or a mark of the last character
    cut_mark = longer and unicodedata.category(text[scan]).startswith("M")
    cut = longer and (text[scan].isalnum() or cut_mark)
    text = text[:scan]
    norm = normalise(text)
    # NFKC and lower case can change lengths (ligatures, combining accents, İ): spans found in the
    # normalised text mark the original only where every character kept its index
    source = text if _aligned(text, norm) else norm
    spans: list[list[int]] = []
    for tok in _normalised_tokens(norm):
        at_cut = cut and tok.end >= len(norm)
        if at_cut and not tok.run:  # a word the scan limit cut short is no match
            break
        if tok.run:
            units = [(m.group(), m.start(), m.end()) for m in _RUN_UNIT.finditer(tok.text)]
            if at_cut and cut_mark:  # a run the scan cut keeps its characters, less one cut from its marks
                units = units[:-1]
            for k, (unit, start, end) in enumerate(units):
                if k + 1 < len(units) and unit + units[k + 1][0] in wanted:
                    spans.append([tok.start + start, tok.start + units[k + 1][2]])
                elif unit in wanted:
                    spans.append([tok.start + start, tok.start + end])
        elif word_term(tok.text) in wanted:
            spans.append([tok.start, tok.end])
    if not spans:
        return None
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    start = max(0, merged[0][0] - width // 4)
    end = min(len(source), start + width)
    if start > 0:  # do not cut a word in half at the window's left edge
        while start > 0 and not source[start - 1].isspace() and start > merged[0][0] - width // 2:
            start -= 1
    snippet = source[start:end]
    marks = [[s - start, min(e, end) - start] for s, e in merged if s < end]
    prefix = "…" if start > 0 else ""
    suffix = "…" if end < len(source) or longer else ""
    shift = len(prefix)
    return {"text": prefix + snippet + suffix, "marks": [[s + shift, e + shift] for s, e in marks]}


def _aligned(text: str, norm: str) -> bool:
    """Whether ``norm`` (``normalise(text)``) has every character of ``text`` at the same index:
    no character widens (ﬁ → fi, ß → ss) and, the lengths being equal, none joins another (e + ◌́ → é)."""
    if text.isascii():  # NFKC leaves ASCII as it is; case folding maps it one to one
        return True
    return len(norm) == len(text) and all(len(unicodedata.normalize("NFKC", ch).casefold()) == 1 for ch in text)


def has_cjk(text: str) -> bool:
    """Whether ``text`` contains any CJK character (Han, kana, hangul)."""
    return _CJK_RUN.search(text) is not None


def has_non_latin_letters(text: str) -> bool:
    """Whether ``text`` has a letter of any script but Latin (Han, Cyrillic, Thai …): a query an
    English-only model cannot read."""
    return _NON_LATIN_LETTER.search(text) is not None


# ---------------------------------------------------------------------------- OCR-tolerant matching
#: Shortest Latin word (query and document side) that may match a word one edit away.
FUZZY_MIN_LENGTH = 5


def query_words(query: str) -> dict[str, str]:
    """term -> the query's word it came from, for the query's word terms (``query_terms`` order)."""
    out: dict[str, str] = {}
    for tok in tokens(query):
        if not tok.run:
            term = word_term(tok.text)
            if term:
                out.setdefault(term, tok.text.strip("'’"))
    return out


_LONG_WORD = re.compile(rf"[^\W\d_{_RUN_CLASS}]{{{FUZZY_MIN_LENGTH},}}", re.UNICODE)
_TRAILING_LETTERS = re.compile(r"[^\W\d_]+$", re.UNICODE)

#: Characters of an image's text fields searched for near words, at most (shared by the fields as
#: ``HIGHLIGHT_SCAN_CHARS`` is; a field after a long one still has its first ``NEAR_FIELD_MIN``).
#: A search looks for near words in up to 200 candidates; their stored fields may hold 40k
#: characters each, and an unbounded scan of such fields of distinct words took tens of seconds.
NEAR_SCAN_CHARS = 4000
NEAR_FIELD_MIN = 500


def _scanned(texts: Iterable[str | None], budget: int = NEAR_SCAN_CHARS) -> Iterator[str]:
    """The first characters of ``texts`` that near-word matching reads: ``budget`` in all, at least
    ``NEAR_FIELD_MIN`` of each; a word the cut splits is left out (its head is not a word)."""
    for text in texts:
        if not text:
            continue
        scan = max(budget, NEAR_FIELD_MIN)
        if len(text) <= scan:
            yield text
        else:  # the word the cut splits (a letter on both sides of it) is not a word of the text
            cut = text[:scan]
            yield _TRAILING_LETTERS.sub("", cut) if text[scan].isalpha() else cut
        budget -= len(text)


def _words(texts: Iterable[str | None]) -> set[str]:
    """Distinct alphabetic words (no bigram script) of at least FUZZY_MIN_LENGTH letters, NFKC +
    case folding (the words ``tokens`` finds; Chinese folding is left out: it changes no such word)."""
    out: set[str] = set()
    for text in texts:
        if text:
            out.update(_LONG_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))
    return out


def within_one_edit(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by at most one insertion, deletion, substitution or swap of
    two neighbouring characters (optimal string alignment distance ≤ 1)."""
    if a == b:
        return True
    la, lb = len(a), len(b)
    if abs(la - lb) > 1:
        return False
    i = 0
    while i < min(la, lb) and a[i] == b[i]:
        i += 1
    if la == lb:
        return a[i + 1:] == b[i + 1:] or (a[i + 1:i + 2] == b[i:i + 1] and a[i:i + 1] == b[i + 1:i + 2]
                                          and a[i + 2:] == b[i + 2:])
    return a[i:] == b[i + 1:] if la < lb else a[i + 1:] == b[i:]


def near_terms(words: dict[str, str], unmatched: Iterable[str], texts: Iterable[str | None]) -> list[str]:
    """The ``unmatched`` query terms whose query word (``words``: term -> word) is one edit away
    from a word of ``texts`` — an OCR misread (``MOTVATION`` for ``motivation``, ``dplans`` for
    ``plans``) that an exact term cannot meet. Both words need FUZZY_MIN_LENGTH letters: shorter
    words are one edit away from too many others. ``texts`` are read up to ``NEAR_SCAN_CHARS``.

    The same answer as ``within_one_edit`` over every pair, in time linear in the text: the query
    words' one-edit forms are indexed once, and each text word of a length that can be one edit
    from one of them is looked up by its own forms — never compared with each query word."""
    wanted = [(t, words[t]) for t in unmatched if t in words and len(words[t]) >= FUZZY_MIN_LENGTH
              and words[t].isalpha()]
    if not wanted:
        return []
    index = _one_edit_index(tuple(wanted))
    found: set[str] = set()
    for word in _words(_scanned(texts)):
        found.update(index.terms_near(word))
        if len(found) == len(wanted):
            break
    return [t for t, _ in wanted if t in found]


@functools.lru_cache(maxsize=256)
def _one_edit_index(wanted: tuple[tuple[str, str], ...]) -> _OneEditIndex:
    """The index of ``wanted``, built once per query (a search asks for it per candidate, with the
    same unmatched words for most); read-only once built, so threads share it."""
    return _OneEditIndex(list(wanted))


class _OneEditIndex:
    """Query words by their one-edit forms: ``terms_near(x)`` is the terms whose word ``w`` has
    ``within_one_edit(w, x)``. A word equals ``w``, or — same length — shares with it a form with
    one position blanked (a substitution) or is ``w`` with two neighbours swapped; or — one longer —
    loses one letter to become ``w``; or — one shorter — is ``w`` less one letter."""

    _BLANK = "\x00"  # never in a word

    def __init__(self, wanted: list[tuple[str, str]]) -> None:
        self.exact: dict[str, set[str]] = {}
        self.blanked: dict[str, set[str]] = {}
        self.swapped: dict[str, set[str]] = {}
        self.shortened: dict[str, set[str]] = {}
        for term, w in wanted:
            self.exact.setdefault(w, set()).add(term)
            for i in range(len(w)):
                self.blanked.setdefault(w[:i] + self._BLANK + w[i + 1:], set()).add(term)
                self.shortened.setdefault(w[:i] + w[i + 1:], set()).add(term)
            for i in range(len(w) - 1):
                self.swapped.setdefault(w[:i] + w[i + 1] + w[i] + w[i + 2:], set()).add(term)
        self.lengths = {len(w) for _, w in wanted}

    def terms_near(self, x: str) -> set[str]:
        n, blank = len(x), self._BLANK
        out: set[str] = set()
        if n in self.lengths:
            for hit in (self.exact.get(x), self.swapped.get(x)):
                if hit:
                    out |= hit
            for i in range(n):
                hit = self.blanked.get(x[:i] + blank + x[i + 1:])
                if hit:
                    out |= hit
        if n - 1 in self.lengths:
            for i in range(n):
                hit = self.exact.get(x[:i] + x[i + 1:])
                if hit:
                    out |= hit
        if n + 1 in self.lengths:
            hit = self.shortened.get(x)
            if hit:
                out |= hit
        return out
