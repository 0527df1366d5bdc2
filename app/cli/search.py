"""``memeflow search TEXT``: the API's semantic text search, from the shell."""

from __future__ import annotations

import json
import sys

import click

from app.cli.common import connected, friendly_errors


def text_search(engine, settings, scope_id: str, query: str, limit: int) -> dict:
    """Exactly ``GET /api/v1/search/text``: the configured text provider and the API's query code."""
    from app.api import search_queries as Q
    from app.worker.providers import Providers

    provider = Providers(settings).text
    config = provider.config()
    vector = provider.embed([query])[0]
    model, dims = str(config["model"]), int(config["dims"])
    items = Q.search_text(engine, scope_id, model=model, dims=dims, vector=vector, limit=limit)
    return {"items": items, "model": model, "coverage": Q.text_coverage(engine, scope_id, model=model)}


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--scope", "scope_id", default="local", show_default=True, help="scope (tenant) to search")
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON shape")
@friendly_errors
def search(text: str, limit: int, scope_id: str, as_json: bool) -> None:
    """Semantic search over the images' current text embeddings (exit 1 when nothing matches)."""
    from rich.console import Console
    from rich.table import Table

    if not text.strip():
        raise click.BadParameter("empty query", param_hint="TEXT")
    with connected() as ctx:
        result = text_search(ctx.engine, ctx.settings, scope_id, text, limit)
    if as_json:
        click.echo(json.dumps(result, default=str, indent=2, ensure_ascii=False))
    else:
        cov = result["coverage"]
        table = Table(title=f"{text!r}  ({result['model']}; {cov['ready']}/{cov['total']} images searchable)")
        for col in ("score", "image", "name", "text in the image"):
            table.add_column(col, justify="right" if col == "score" else "left")
        for hit in result["items"]:
            image = hit["image"]
            ocr = ((image.get("context") or {}).get("ocr_text") or "").replace("\n", " ")
            table.add_row(f"{hit['score']:.3f}", str(image["id"]), image.get("display_name") or "", ocr[:60])
        Console().print(table)
    sys.exit(0 if result["items"] else 1)
