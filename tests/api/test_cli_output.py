"""CLI output of user-controlled text (issue 17 §2): hostile display names, OCR text, file names
and error messages are shown literally — no rich markup applied, no terminal escape sequence or
control character emitted, no crash while rendering."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from app.cli import main
from app.cli.demo import _hit_line
from app.cli.search import hits_table
from app.cli.status import job_table
from tests.api.conftest import png_bytes, upload

HOSTILE = "[red]owned[/red] [/] [link=file:///etc/passwd]x[/link] \x1b[2J\x1b]0;pwn\x07\r\x08\u202egnp.exe"
RAW_BYTES = ("\x1b", "\x07", "\x08", "\r", "\u202e")


def rendered(renderable) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, color_system=None, width=400, force_terminal=False).print(renderable)
    return out.getvalue()


def assert_inert(out: str) -> None:
    for ch in RAW_BYTES:
        assert ch not in out, (ch, out)
    assert "\\x1b[2J" in out  # shown, visibly escaped


@pytest.fixture()
def hostile_image(client) -> dict:
    """An image uploaded through the API with a hostile display name, as the API returns it."""
    r = upload(client, png_bytes(), display_name=HOSTILE)
    if r.status_code == 422:  # the API may refuse control characters; markup alone is a valid name
        r = upload(client, png_bytes(), display_name="[red]owned[/red] [/]")
    assert r.status_code == 201, r.get_json()
    image = client.get(f"/api/v1/images/{r.get_json()['image']['id']}").get_json()
    image = image.get("image", image)
    assert image["display_name"].startswith("[red]owned[/red] [/]")  # stored as given: escaping is the printer's job
    # rows written before any validation, OCR text and file names can still carry control characters
    image["display_name"] = HOSTILE
    image["context"] = {"ocr_text": HOSTILE}
    return image


def test_search_hits_render_hostile_names_literally(hostile_image):
    result = {"items": [{"score": 0.9, "image": hostile_image}], "model": "m",
              "coverage": {"ready": 1, "total": 1}}
    out = rendered(hits_table(HOSTILE, "hybrid", result))
    assert_inert(out)
    assert "[red]owned[/red]" in out  # the text itself, not red


def test_search_highlights_escape_control_characters_and_keep_their_marks(hostile_image):
    from app.cli.search import highlighted

    source = "before \x1b[31mBUILD\x07 passes [/] after"
    start = source.index("BUILD")
    text = highlighted({"image": hostile_image, "highlight": {"text": source, "marks": [[start, start + 5]]}})
    assert "\x1b" not in text.plain and "\\x1b[31mBUILD\\x07 passes [/] after" in text.plain
    (span,) = text.spans
    assert text.plain[span.start:span.end] == "BUILD"  # the mark still covers the matched word
    out = rendered(text)
    assert "\x1b" not in out and "\x07" not in out


def test_demo_hit_lines_render_hostile_names_literally(hostile_image):
    out = rendered(_hit_line({"score": 0.5, "image": hostile_image}))
    assert_inert(out)
    assert "[red]owned[/red] [/]" in out


def test_status_job_table_renders_hostile_error_messages_literally():
    job = {"id": "j1", "status": "failed", "progress": 0.5, "error": {"code": "agent_failed", "message": HOSTILE},
           "stages": [{"stage": "agent", "status": "failed", "attempt_count": 2,
                       "error": {"code": "provider_error", "message": HOSTILE}, "retry_at": None,
                       "updated_at": "2026-12-01"}]}
    out = rendered(job_table(job))
    assert_inert(out)
    assert "[red]owned[/red]" in out


def test_ingest_reports_a_hostile_file_name_inertly(settings, tmp_path):
    from app.config import reset_settings

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "\x1b[31mevil\x07[red]x.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    reset_settings(settings)
    try:
        r = CliRunner().invoke(main, ["ingest", str(inbox)])
    finally:
        reset_settings(None)
    assert r.exit_code == 1
    assert "failed 1" in r.stdout
    assert "\x1b" not in r.output and "\x07" not in r.output
    assert "\\x1b[31mevil\\x07[red]x.png" in r.stderr


def test_cli_errors_quoting_user_text_are_inert(settings, engine):
    from app.auth import create_scope
    from app.config import reset_settings

    create_scope(engine, "alpha")
    reset_settings(settings)
    try:
        runner = CliRunner()
        r = runner.invoke(main, ["tokens", "revoke", "\x1b]0;pwn\x07name"])
        assert r.exit_code == 1 and "\x1b" not in r.output and "\\x1b]0;pwn" in r.output
        r = runner.invoke(main, ["tokens", "create", "alpha", "--name", HOSTILE])
        assert r.exit_code == 0, r.output
        listing = runner.invoke(main, ["tokens", "list"]).output
        for ch in RAW_BYTES:
            assert ch not in listing
        assert "[red]owned[/red]" in listing
    finally:
        reset_settings(None)


def test_search_json_output_escapes_what_a_terminal_acts_on(monkeypatch):
    """``memeflow search --json`` prints stored contexts (an agent's OCR text and title) with
    non-ASCII letters readable: JSON itself escapes only U+0000–U+001F, so C1 controls (U+009B is
    CSI to a UTF-8 xterm) and bidi overrides reached the terminal raw. They are \\u escapes now, and
    the output still parses back to the same result."""
    import contextlib
    import json
    from types import SimpleNamespace

    from app.cli import search as search_cli

    ocr = "caf\u00e9 \u732b \x9b31mred\x9b0m \x7f \u202egnp.exe \u2066x\u2069 \u2028"
    result = {"items": [{"score": 0.5, "image": {"id": "i1", "display_name": "\x85name",
                                                 "context": {"ocr_text": ocr, "title": "\u200f\u061c"}}}],
              "model": "m", "coverage": {"ready": 1, "total": 1}}
    monkeypatch.setattr(search_cli, "connected",
                        lambda: contextlib.nullcontext(SimpleNamespace(engine=None, settings=None)))
    monkeypatch.setattr(search_cli, "text_search", lambda *a, **k: result)
    r = CliRunner().invoke(main, ["search", "cat", "--json"])
    assert r.exit_code == 0, r.output
    for ch in ("\x9b", "\x7f", "\x85", "\u202e", "\u2066", "\u2069", "\u200f", "\u061c", "\u2028"):
        assert ch not in r.output, repr(ch)
    assert "caf\u00e9 \u732b" in r.output  # letters stay readable
    assert json.loads(r.output) == result
