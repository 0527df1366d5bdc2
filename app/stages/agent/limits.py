"""The largest context a human may write (PATCH /api/v1/images/{id}), which every agent's context
must fit too: a context read back and saved again — the library page's edit form sends every
field — must never be refused for what an agent wrote. One place for both sides."""

from __future__ import annotations

TITLE_MAX = 500
DESCRIPTION_MAX = 10_000
OCR_TEXT_MAX = 20_000
TAG_MAX = 100
TAGS_MAX = 100
