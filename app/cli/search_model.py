"""``memeflow search-model status|cutover|rollback|resume [--kind text|visual]``: a scope's search
serving model during a model change (app/orchestrator/serving.py; docs/operations.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from app.cli.common import connected, friendly_errors, require_scope, scope_param
from app.cli.safe_text import cell, printable
from app.db.enums import ServingKind


def serving_table(rows: list[dict[str, Any]]) -> Any:
    """Every scope's serving model, target and its coverage (as of the last check), epoch."""
    from rich.table import Table

    table = Table(title="search serving")
    for col in ("scope", "kind", "state", "epoch", "serving model", "target model", "target coverage", "switched"):
        table.add_column(col, justify="right" if col in ("epoch", "target coverage") else "left")
    for r in rows:
        target = r["target"] or {}
        cov = target.get("coverage")
        table.add_row(cell(r["scope_id"]), r["kind"], r["state"], str(r["epoch"]), cell(r["model"]),
                      cell(target.get("model") or "-"),
                      f"{cov['ready']}/{cov['total']}" if cov else "-", cell(r["switched_at"] or "-"))
    return table


def _print(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(doc, default=str, indent=2))
        return
    cov = doc.get("coverage") or {}
    needs = "images with a context" if doc["kind"] == "text" else "images"
    click.echo(f"scope {printable(doc['scope_id'])} ({doc['kind']}): {doc['state']}, epoch {doc['epoch']}, serving "
               f"{printable(doc['model'])} ({cov.get('ready', '?')}/{cov.get('total', '?')} {needs})")
    if doc.get("target"):
        t = doc["target"]
        click.echo(f"  target {printable(t['model'])}: {t['coverage']['ready']}/{t['coverage']['total']}"
                   f" (fill round {t['fill_rounds']}, batch {t['batch_id'] or '-'})")
    if doc.get("pending_change"):
        p = doc["pending_change"]
        click.echo(f"  pending change to {printable(p['model'])}: sweeps disagree since {p['since']}"
                   " (it begins once none agrees with the current model for MEMEFLOW_SEARCH_CONFIG_GRACE_S)")
    if doc.get("previous"):
        click.echo(f"  previous {printable(doc['previous']['model'])} (rollback target)")
    for e in doc.get("events", []):
        click.echo(f"  {e['at']}  {e['action']:<13} epoch {e['epoch']}  {printable(e['from_model'] or '-')}"
                   f" -> {printable(e['to_model'] or '-')}")


@click.group("search-model")
def search_model() -> None:
    """Which text model each scope's search reads; cut over early, roll back, resume."""


KIND = click.option("--kind", type=click.Choice([k.value for k in ServingKind]), default="text", show_default=True,
                    help="which search")


@search_model.command("status")
@click.option("--scope", "scope_id", default=None, callback=scope_param,
              help="one scope (with live coverage and its history)")
@KIND
@click.option("--json", "as_json", is_flag=True)
@friendly_errors
def status_cmd(scope_id: str | None, kind: str, as_json: bool) -> None:
    """Every scope's serving state (both kinds), or one scope's in detail."""
    from rich.console import Console

    with connected() as ctx:
        if scope_id is not None:
            require_scope(ctx, scope_id)
            _print(ctx.orch.search_serving_status(scope_id, kind), as_json)
            return
        rows = ctx.orch.search_serving_overview()
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
    elif not rows:
        click.echo("no scope has a serving state yet (the sweep creates them)")
    else:
        Console().print(serving_table(rows))


@search_model.command("cutover")
@click.option("--scope", "scope_id", required=True, callback=scope_param)
@KIND
@click.option("--json", "as_json", is_flag=True)
@friendly_errors
def cutover_cmd(scope_id: str, kind: str, as_json: bool) -> None:
    """Serve the target model now, before it covers every image (those it lacks are found by words only)."""
    with connected() as ctx:
        require_scope(ctx, scope_id)
        _print(ctx.orch.search_cutover(scope_id, kind), as_json)


@search_model.command("rollback")
@click.option("--scope", "scope_id", required=True, callback=scope_param)
@KIND
@click.option("--json", "as_json", is_flag=True)
@friendly_errors
def rollback_cmd(scope_id: str, kind: str, as_json: bool) -> None:
    """Abort a backfill, or serve the previous model again after a cutover; the scope stays pinned."""
    from app.publisher import publisher_from_settings

    with connected() as ctx:
        require_scope(ctx, scope_id)
        doc, hints = ctx.orch.search_rollback(scope_id, kind)
        publisher_from_settings(ctx.settings).publish(hints)  # after the rollback's commit
        _print(doc, as_json)


@search_model.command("resume")
@click.option("--scope", "scope_id", required=True, callback=scope_param)
@KIND
@click.option("--json", "as_json", is_flag=True)
@friendly_errors
def resume_cmd(scope_id: str, kind: str, as_json: bool) -> None:
    """Unpin: the sweep starts a backfill towards the configured model if it differs."""
    with connected() as ctx:
        require_scope(ctx, scope_id)
        _print(ctx.orch.search_resume(scope_id, kind), as_json)
