"""``memeflow process-all``: a batch over the whole library (POST /api/v1/batches), with its progress."""

from __future__ import annotations

import sys
import time

import click

from app.cli.common import Seconds, connected, friendly_errors, require_scope, scope_param
from app.db.enums import ACTIVE_JOB_STATUSES, BatchStatus

BAD_OUTCOMES = ("failed", "blocked", "unknown_execution")


@click.command("process-all")
@click.option("--scope", "scope_id", default="local", show_default=True, callback=scope_param,
              help="scope (tenant) to process")
@click.option("--policy", type=click.Choice(["forbid", "auto"]), default="forbid", show_default=True,
              help="reverse_image_policy of the batch's jobs")
@click.option("--wait", is_flag=True, help="show a progress bar until the batch completes")
@click.option("--timeout", "timeout_s", type=Seconds(0), default=3600.0, show_default=True,
              help="with --wait: give up after this many seconds (exit 1)")
@friendly_errors
def process_all(scope_id: str, policy: str, wait: bool, timeout_s: float) -> None:
    """Process every image of the scope (stages already valid are reused, not recomputed).

    Exit code 0 when the batch is created (with --wait: completed with no failed, blocked or
    unknown_execution job), 1 otherwise — also for a scope that does not exist (nothing is created).
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from app.publisher import publisher_from_settings

    with connected() as ctx:
        require_scope(ctx, scope_id)  # a mistyped --scope is no new, empty scope
        batch, hints = ctx.orch.create_batch(scope_id, all=True, reverse_image_policy=policy)
        publisher_from_settings(ctx.settings).publish(hints)  # after the batch's commit
        click.echo(f"batch {batch['id']}: {batch['total']} images")
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
            bar = progress.add_task("batch", total=max(batch["total"], 1))
            while True:
                batch = ctx.orch.get_batch(scope_id, batch["id"])
                done = sum(n for s, n in batch["counts"].items() if s not in ACTIVE_JOB_STATUSES)
                progress.update(bar, completed=done if batch["total"] else 1)
                if batch["status"] in (BatchStatus.COMPLETED, BatchStatus.CANCELLED) or (batch["status"] == BatchStatus.RUNNING
                                                                      and batch["progress"] >= 1.0):
                    break
                if time.monotonic() > deadline:
                    click.echo(f"error: batch not finished after {timeout_s:g}s: {batch['counts']}", err=True)
                    sys.exit(1)
                time.sleep(0.5)
    counts = ", ".join(f"{s} {n}" for s, n in sorted(batch["counts"].items())) or "no jobs"
    click.echo(f"batch {batch['id']} {batch['status']}: {counts}")
    sys.exit(1 if batch["status"] == BatchStatus.CANCELLED or any(batch["counts"].get(s) for s in BAD_OUTCOMES) else 0)
