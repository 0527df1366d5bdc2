"""CLI output of user-controlled text: no terminal escapes, no control characters, no rich markup."""

from __future__ import annotations

import io

import pytest

from app.cli.safe_text import cell, markup_safe, printable

HOSTILE = "[red]pwned[/red] [/] \x1b[2J\x1b]0;title\x07 \r\x08fake\u202eexe.png \x9b31m"


def render(renderable) -> str:
    from rich.console import Console

    out = io.StringIO()
    # No colour system: every escape byte in the output came from the text, not from rich.
    Console(file=out, color_system=None, width=300).print(renderable)
    return out.getvalue()


def test_printable_makes_control_and_bidi_characters_visible():
    text = printable(HOSTILE)
    assert "\x1b" not in text and "\x07" not in text and "\x08" not in text and "\x9b" not in text
    assert "\u202e" not in text and "\r" not in text
    assert "\\x1b[2J" in text and "\\u202e" in text
    assert printable("a\nb\tc") == "a b c"
    assert printable("a\nb", one_line=False) == "a\nb"
    assert printable("家族 👨\u200d👩\u200d👧 ok") == "家族 👨\u200d👩\u200d👧 ok"  # emoji ZWJ kept
    assert printable(None) == "" and printable("x" * 10, max_len=3) == "xxx"


def test_a_rich_cell_is_printed_literally():
    out = render(cell(HOSTILE))
    assert "[red]pwned[/red] [/]" in out  # shown as typed, not applied
    assert "\x1b[2J" not in out and "\x1b]0;" not in out and "\x07" not in out


def test_markup_safe_survives_interpolation():
    out = render(f"[bold]hit[/bold] {markup_safe(HOSTILE)}")
    assert "hit [red]pwned[/red] [/]" in out and "\x1b[2J" not in out


def test_without_escaping_rich_would_pass_escapes_or_crash():
    from rich.errors import MarkupError
    from rich.text import Text

    assert "\x1b[2J" in render(Text(HOSTILE))  # rich keeps ESC: escaping is ours to do
    with pytest.raises(MarkupError):
        render(f"hit {HOSTILE}")
