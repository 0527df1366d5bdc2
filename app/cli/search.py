"""``memeflow search TEXT``: the API's hybrid text search, from the shell."""

from __future__ import annotations

import json
import sys

import click

from app.cli.common import connected, friendly_errors


def text_search(engine, settings, scope_id: str, query: str, limit: int, mode: str = "hybrid") -> dict:
    """Exactly ``GET /api/v1/search/text``: the configured text provider and the API's search code."""
    from app.search.service import search_text
    from app.worker.providers import Providers

    return search_text(engine, Providers(settings).text, scope_id, query, limit=limit, mode=mode)


def highlighted(hit: dict):
    """The hit's highlight (or its OCR text) as rich Text, matches in bold — user text never
    parsed as markup."""
    from rich.text import Text

    hl = hit.get("highlight")
    if not hl:
        ocr = ((hit["image"].get("context") or {}).get("ocr_text") or "").replace("\n", " / ")
        return Text(ocr[:60])
    out = Text(hl["text"])
    for start, end in hl["marks"]:
        out.stylize("bold yellow", start, end)
    return out


def signals(hit: dict) -> str:
    """Which signals found the hit, with their ranks: ``sem#1 lex#3``."""
    m = hit.get("matched") or {}
    return " ".join(f"{short}#{m[name]['rank']}" for name, short in (("semantic", "sem"), ("lexical", "lex"))
                    if name in m)


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--scope", "scope_id", default="local", show_default=True, help="scope (tenant) to search")
@click.option("--mode", type=click.Choice(["hybrid", "semantic", "lexical"]), default="hybrid", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON shape")
@friendly_errors
def search(text: str, limit: int, scope_id: str, mode: str, as_json: bool) -> None:
    """Hybrid search (meaning + words) over the images' current text (exit 1 when nothing matches)."""
    from rich.console import Console
    from rich.table import Table

    if not text.strip():
        raise click.BadParameter("empty query", param_hint="TEXT")
    with connected() as ctx:
        result = text_search(ctx.engine, ctx.settings, scope_id, text, limit, mode)
    if as_json:
        click.echo(json.dumps(result, default=str, indent=2, ensure_ascii=False))
    else:
        cov = result["coverage"]
        from rich.text import Text

        title = Text(f"{text!r}  ({mode}; {result['model']}; {cov['ready']}/{cov['total']} images embedded)")
        table = Table(title=title)
        for col in ("score", "found by", "image", "name", "match"):
            table.add_column(col, justify="right" if col == "score" else "left")
        for hit in result["items"]:
            image = hit["image"]
            table.add_row(f"{hit['score']:.3f}", signals(hit), str(image["id"]),
                          Text(image.get("display_name") or ""), highlighted(hit))
        Console().print(table)
    sys.exit(0 if result["items"] else 1)
