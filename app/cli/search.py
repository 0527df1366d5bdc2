"""``memeflow search TEXT``: the API's hybrid text search, from the shell."""

from __future__ import annotations

import sys
from typing import Any

import click

from app.cli.common import connected, friendly_errors, require_scope, scope_param
from app.cli.safe_text import cell, json_text, printable


def text_search(engine, settings, scope_id: str, query: str, limit: int, mode: str = "hybrid") -> dict:
    """Exactly ``GET /api/v1/search/text``: the configured text provider and the API's search code."""
    from app.search.service import QueryNotEmbeddable, search_text
    from app.search.serving import text_source
    from app.stages.providers import Providers

    source = text_source(engine, scope_id, Providers(settings).text, settings)
    try:
        result = search_text(engine, source.provider, scope_id, query, limit=limit, mode=mode)
    except QueryNotEmbeddable as exc:  # the API's 422 query_not_embeddable
        raise click.ClickException(str(exc)) from None
    return {**result, "serving": source.info}


def highlighted(hit: dict):
    """The hit's highlight (or its OCR text) as rich Text, matches in bold — user text never
    parsed as markup, its control characters shown escaped (each piece is escaped on its own,
    so the marks' offsets into the original text still apply)."""
    from rich.text import Text

    hl = hit.get("highlight")
    if not hl:
        ocr = ((hit["image"].get("context") or {}).get("ocr_text") or "").replace("\n", " / ")
        return cell(ocr, max_len=60)
    source, out, pos = hl["text"], Text(), 0
    for start, end in sorted(hl["marks"]):
        start = max(start, pos)
        if end <= start:
            continue
        out.append(printable(source[pos:start]))
        out.append(printable(source[start:end]), style="bold yellow")
        pos = end
    out.append(printable(source[pos:]))
    return out


def signals(hit: dict) -> str:
    """Which signals found the hit, with their ranks: ``sem#1 lex#3``."""
    m = hit.get("matched") or {}
    return " ".join(f"{short}#{m[name]['rank']}" for name, short in (("semantic", "sem"), ("lexical", "lex"))
                    if name in m)


def hits_table(query: str, mode: str, result: dict) -> Any:
    """The hits as a rich table; names, highlights and OCR text are printed literally."""
    from rich.table import Table

    cov = result["coverage"]
    title = cell(f"'{printable(query)}'  ({mode}; {result['model']}; {cov['ready']}/{cov['total']} images embedded)")
    table = Table(title=title)
    for col in ("score", "found by", "image", "name", "match"):
        table.add_column(col, justify="right" if col == "score" else "left")
    for hit in result["items"]:
        image = hit["image"]
        table.add_row(f"{hit['score']:.3f}", signals(hit), cell(image["id"]),
                      cell(image.get("display_name") or ""), highlighted(hit))
    return table


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--scope", "scope_id", default="local", show_default=True, callback=scope_param,
              help="scope (tenant) to search")
@click.option("--mode", type=click.Choice(["hybrid", "semantic", "lexical"]), default="hybrid", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON shape")
@friendly_errors
def search(text: str, limit: int, scope_id: str, mode: str, as_json: bool) -> None:
    """Hybrid search (meaning + words) over the images' current text (exit 1 when nothing matches)."""
    from rich.console import Console

    if not text.strip():
        raise click.BadParameter("empty query", param_hint="TEXT")
    with connected() as ctx:
        require_scope(ctx, scope_id, unless_default=True)
        result = text_search(ctx.engine, ctx.settings, scope_id, text, limit, mode)
    if as_json:
        # non-ASCII letters stay readable; control and bidi characters are \u escapes
        click.echo(json_text(result))
    else:
        Console().print(hits_table(text, mode, result))
    sys.exit(0 if result["items"] else 1)
