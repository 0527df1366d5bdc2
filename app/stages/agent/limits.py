"""The largest context a human may write (PATCH /api/v1/images/{id}), which every agent's context
must fit too: a context read back and saved again — the library page's edit form sends every
field — must never be refused for what an agent wrote. One place for both sides."""

from __future__ import annotations

TITLE_MAX = 500
DESCRIPTION_MAX = 10_000
OCR_TEXT_MAX = 20_000
TAG_MAX = 100
TAGS_MAX = 100

#: An agent's pixel facts (``context["facts"]``, never edited by a human): at most this deep (the
#: facts object itself is level 1) and this many bytes as JSON — what the built-in agents write is
#: one level and ~100 bytes.
FACTS_DEPTH_MAX = 16
FACTS_MAX_BYTES = 16 * 1024
