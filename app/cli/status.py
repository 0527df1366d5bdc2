"""``memeflow status [JOB_ID] [--watch]``: the database's truth as tables (what /ops shows)."""

from __future__ import annotations

import json
import threading
from typing import Any

import click

from app.cli.common import Seconds, connected, friendly_errors, require_scope, scope_param
from app.cli.safe_text import cell, printable
from app.ids import parse_uuid

TERMINAL_STAGE = ("succeeded", "reused", "failed", "blocked", "unknown_execution", "cancelled", "skipped")


def overview_tables(engine, scope_id: str, agent_lane_limit: int, settings=None) -> tuple[Any, Any, dict]:
    """(jobs-by-status table, lanes table, the same data as a dict) from the /ops read queries;
    with ``settings`` the lanes table also shows live workers and the last sweep's age."""
    from rich.table import Table

    from app.ops import queries as Q
    from app.orchestrator.liveness import read_liveness_txn

    with engine.connect() as conn:
        jobs = Q.jobs_by_status(conn, scope_id)
        liveness = read_liveness_txn(conn, settings) if settings is not None else None
        # the live agent workers admit under the most conservative limit they registered, not this shell's setting
        force = liveness.agent_limits_in_force if liveness is not None else None
        lanes = Q.lane_stats(conn, scope_id, {"agent": (force.lane if force else agent_lane_limit) or None})
    jobs_table = Table(title=cell(f"jobs by status (scope {printable(scope_id)})"))
    jobs_table.add_column("status")
    jobs_table.add_column("jobs", justify="right")
    for status, n in jobs.items():
        if n:
            jobs_table.add_row(status, str(n))
    jobs_table.add_row("[bold]total[/bold]", f"[bold]{sum(jobs.values())}[/bold]")
    lanes_table = Table(title="lanes", caption=_sweep_caption(liveness))
    columns = ("lane", "queued", "due", "running", "slots in use", "oldest queued") + (("workers",) if liveness else ())
    for col in columns:
        lanes_table.add_column(col, justify="left" if col == "lane" else "right")
    for lane in lanes:
        slots = f"{lane.slots_in_use}/{lane.slot_limit}" if lane.slot_limit else str(lane.slots_in_use)
        age = f"{lane.oldest_queued_age_s:.1f}s" if lane.oldest_queued_age_s is not None else "-"
        cells = [lane.lane, str(lane.queued), str(lane.due), str(lane.running), slots, age]
        if liveness:
            live = liveness.lanes[lane.lane]
            cells.append(f"[bold red]{live.workers} (unserved)[/bold red]" if live.unserved else str(live.workers))
        lanes_table.add_row(*cells)
    if liveness:
        hooks = liveness.lanes["webhooks"]
        due = "yes" if hooks.queued else "no"
        lanes_table.add_row("webhooks", "", due, "", "", "",
                            f"[bold red]{hooks.workers} (unserved)[/bold red]" if hooks.unserved else str(hooks.workers))
        lanes_table.add_row("maintenance", "", "", "", "", "", str(liveness.lanes["maintenance"].workers))
    data = {"jobs": jobs, "lanes": {lane.lane: {"queued": lane.queued, "due": lane.due, "running": lane.running,
                                                "slots_in_use": lane.slots_in_use} for lane in lanes}}
    if liveness:
        data["liveness"] = liveness.as_dict()
        for name, row in data["lanes"].items():
            row["workers"] = liveness.lanes[name].workers
    return jobs_table, lanes_table, data


def _sweep_caption(liveness) -> str | None:
    """The last sweep's age and any degraded reasons, under the lanes table."""
    if liveness is None:
        return None
    age = liveness.sweep_age_s
    line = "last sweep: never" if age is None else f"last sweep: {age:.1f}s ago (every {liveness.sweep_interval_s:g}s)"
    failed = [f["step"] for f in liveness.sweep_failed_steps]
    if failed:
        line += f" (steps failed: {', '.join(failed)} — see the worker log)"
    problems = "; ".join(r["message"] for r in liveness.reasons)
    return f"{line}; degraded: {problems}" if problems else line


def serving_line(doc: dict) -> Any:
    """The scope's search serving model (and a model change's progress) in one line (no markup)."""
    from rich.text import Text

    cov = doc.get("coverage") or {}
    label, needs = ("search", "images with a context") if doc["kind"] == "text" else ("visual search", "images")
    line = (f"{label}: {printable(doc['model'])} ({doc['state']}, epoch {doc['epoch']}, "
            f"{cov.get('ready', 0)}/{cov.get('total', 0)} {needs} embedded)")
    target = doc.get("target")
    if target:
        tc = target["coverage"]
        line += f"; backfilling {printable(target['model'])}: {tc['ready']}/{tc['total']}"
    return Text(line)


def job_table(job: dict) -> Any:
    """One job's stages, in pipeline order (error texts printed literally: they may quote
    provider responses or file contents)."""
    from rich.table import Table

    error = job.get("error") or {}
    title = f"job {job['id']}  {job['status']}  progress {float(job.get('progress') or 0):.0%}"
    if error:
        title += f"  error {error.get('code')}: {error.get('message')}"
    table = Table(title=cell(title))
    for col in ("stage", "status", "attempts", "error", "retry at", "updated"):
        table.add_column(col)
    for stage in job.get("stages", []):
        err = stage.get("error") or {}
        table.add_row(cell(stage["stage"]), cell(stage["status"]), str(stage.get("attempt_count") or 0),
                      cell(f"{err.get('code')}: {err.get('message')}" if err else ""),
                      cell(stage.get("retry_at") or ""), cell(stage.get("updated_at") or ""))
    return table


@click.command()
@click.argument("job_id", required=False)
@click.option("--scope", "scope_id", default="local", show_default=True, callback=scope_param,
              help="scope (tenant) to show")
@click.option("--watch", is_flag=True, help="refresh until Ctrl-C")
@click.option("--interval", type=Seconds(0.1), default=2.0, show_default=True, help="seconds between refreshes")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables (no --watch)")
@friendly_errors
def status(job_id: str | None, scope_id: str, watch: bool, interval: float, as_json: bool) -> None:
    """Jobs by status and per-lane queued/running; with JOB_ID, that job's stages."""
    from rich.console import Console, Group
    from rich.live import Live

    if job_id is not None:
        parsed = parse_uuid(job_id)
        if parsed is None:
            raise click.BadParameter(f"not a job id: {job_id!r}", param_hint="JOB_ID")
        job_id = str(parsed)
    if watch and as_json:
        raise click.UsageError("--watch and --json do not go together")
    console = Console()
    with connected() as ctx:
        require_scope(ctx, scope_id, unless_default=True)
        def render() -> tuple[Any, Any]:
            if job_id is not None:
                job = ctx.orch.get_job(scope_id, job_id)  # NotFound → exit 1 via friendly_errors
                return job_table(job), job
            jobs_table, lanes_table, data = overview_tables(ctx.engine, scope_id, ctx.settings.agent_slots,
                                                            ctx.settings)
            data["search_serving"] = ctx.orch.search_serving_status(scope_id)
            data["search_serving"].pop("events", None)
            data["visual_serving"] = ctx.orch.search_serving_status(scope_id, "visual")
            data["visual_serving"].pop("events", None)
            return Group(jobs_table, lanes_table, serving_line(data["search_serving"]),
                         serving_line(data["visual_serving"])), data

        renderable, data = render()
        if as_json:
            click.echo(json.dumps(data, default=str, indent=2))
            return
        if not watch:
            console.print(renderable)
            return
        stop = threading.Event()
        with Live(renderable, console=console, refresh_per_second=4) as live:
            try:
                while not stop.wait(interval):
                    live.update(render()[0])
            except KeyboardInterrupt:
                pass
