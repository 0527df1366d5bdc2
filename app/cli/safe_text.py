"""Terminal-safe rendering of text the CLI did not write itself.

Display names, file names, OCR text, error messages and token names come from uploads, the file
system, providers or other operators. Printed raw they could carry ANSI/OSC escape sequences
(recolour, retitle or clear the terminal, forge lines), other control characters, bidi overrides
that reorder what is shown, or rich markup (``[red]``, ``[/]``) that restyles the output or makes
rich raise while rendering. Everything user-controlled goes through :func:`printable` (for
``click.echo``) or :func:`cell`/:func:`markup_safe` (for rich) before it reaches the terminal.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# Format characters that reorder displayed text (Trojan-Source style); other Cf characters such
# as the zero-width joiner inside emoji sequences are harmless and kept.
_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
_LINE_BREAKS = {"\n", "\r", "\t", "\u2028", "\u2029", "\x0b", "\x0c", "\x85"}


def _visible(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any, *, one_line: bool = True, max_len: int | None = None) -> str:
    """``value`` as text with no control characters: line breaks and tabs become spaces (or stay,
    with ``one_line=False``), every other control or bidi character becomes a visible ``\\xNN``."""
    text = "" if value is None else str(value)
    if max_len is not None:
        text = text[:max_len]
    out = []
    for ch in text:
        if ch in _LINE_BREAKS:
            out.append(" " if one_line else ("\n" if ch in "\n\r\u2028\u2029\x85" else " "))
        elif unicodedata.category(ch) == "Cc" or ord(ch) in _BIDI:
            out.append(_visible(ch))
        else:
            out.append(ch)
    return "".join(out)


def cell(value: Any, *, max_len: int | None = None):
    """A rich :class:`~rich.text.Text` of ``value``: printed literally, never parsed as markup."""
    from rich.text import Text

    return Text(printable(value, max_len=max_len))


def markup_safe(value: Any, *, max_len: int | None = None) -> str:
    """``value`` made printable and escaped for interpolation into a rich markup string."""
    from rich.markup import escape

    return escape(printable(value, max_len=max_len))


# What ``json.dumps(..., ensure_ascii=False)`` leaves raw that a terminal acts on: DEL and the C1
# controls (U+0080–U+009F; U+009B is CSI, which UTF-8 terminals such as xterm obey) and the bidi
# controls of ``_BIDI`` plus the line/paragraph separators. JSON escapes only U+0000–U+001F.
_JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029" + "".join(chr(c) for c in sorted(_BIDI)) + "]")


def json_text(value: Any) -> str:
    """``value`` as indented JSON, non-ASCII letters readable, with every character a terminal
    would act on written as a ``\\uXXXX`` escape (only string contents can hold one, so the
    document parses back to the same value)."""
    text = json.dumps(value, default=str, indent=2, ensure_ascii=False)
    return _JSON_RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
