"""``memeflow demo``: the whole pipeline on the bundled sample memes, end to end.

Embedded services → migrations → API, one worker per lane, beat and Flower (the ``Stack``
supervisor of :mod:`app.cli.stack`) → generate samples → upload them through the REST API →
live per-stage progress until every job is terminal → summary → text and visual searches →
the library page's URL → stop (or, with ``--keep``, leave the stack and the page running until Ctrl-C).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import click

from app.cli.common import cli_settings, friendly_errors
from app.cli.safe_text import markup_safe, printable

# words from a caption, and meanings in other words, in English and Chinese
TEXT_QUERIES = ("build passes", "a sleeping kitty", "加油", "上班偷懒很开心")
NEAR_DUPLICATE = "build-passes-small.jpg"
TERMINAL = ("succeeded", "failed", "blocked", "unknown_execution", "target_changed", "superseded", "cancelled")
STAGE_DONE = ("succeeded", "reused", "failed", "blocked", "unknown_execution", "cancelled")


def start_stack(settings, echo):
    """Start embedded services, migrations and every process; returns the running stack."""
    from app.cli.stack import Stack  # the Celery runtime's supervisor

    return Stack(settings, echo=echo).start()


def stage_progress(engine, image_ids: list[str]) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """Per stage (done, total) over the latest job of each image, and latest jobs by status."""
    from sqlalchemy import text

    with engine.connect() as conn:
        stages = conn.execute(text("""
            WITH latest AS (
              SELECT DISTINCT ON (image_id) id, status FROM processing_jobs
               WHERE image_id = ANY(CAST(:ids AS uuid[])) ORDER BY image_id, revision DESC)
            SELECT js.stage, count(*) FILTER (WHERE js.status = ANY(:done)) AS done, count(*) AS total
              FROM job_stages js JOIN latest l ON l.id = js.job_id GROUP BY js.stage"""),
            {"ids": image_ids, "done": list(STAGE_DONE)}).all()
        jobs = conn.execute(text("""
            SELECT status, count(*) FROM (
              SELECT DISTINCT ON (image_id) status FROM processing_jobs
               WHERE image_id = ANY(CAST(:ids AS uuid[])) ORDER BY image_id, revision DESC) j GROUP BY status"""),
            {"ids": image_ids}).all()
    return {r.stage: (int(r.done), int(r.total)) for r in stages}, {r[0]: int(r[1]) for r in jobs}


def stage_timings(engine, image_ids: list[str]) -> dict[str, tuple[int, float]]:
    """Per stage: (runs, mean seconds from start to completion) over the images' succeeded stages."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT js.stage, count(*), avg(extract(epoch FROM js.completed_at - js.started_at))
              FROM job_stages js JOIN processing_jobs j ON j.id = js.job_id
             WHERE j.image_id = ANY(CAST(:ids AS uuid[])) AND js.status = 'succeeded'
               AND js.started_at IS NOT NULL AND js.completed_at IS NOT NULL
             GROUP BY js.stage"""), {"ids": image_ids}).all()
    return {r[0]: (int(r[1]), float(r[2] or 0.0)) for r in rows}


def wait_until_terminal(engine, image_ids: list[str], console, *, timeout_s: float) -> dict[str, int]:
    """Live per-stage progress bars until every image's latest job is terminal (or the deadline)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from app.db.enums import STAGE_ORDER

    stages = [s.value for s in STAGE_ORDER]
    deadline = time.monotonic() + timeout_s
    with Progress(TextColumn("{task.description:<15}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bars = {s: progress.add_task(s, total=len(image_ids)) for s in stages}
        jobs_bar = progress.add_task("jobs terminal", total=len(image_ids))
        while True:
            per_stage, jobs = stage_progress(engine, image_ids)
            for s in stages:
                done, total = per_stage.get(s, (0, len(image_ids)))
                progress.update(bars[s], completed=done, total=max(total, 1))
            finished = sum(n for st, n in jobs.items() if st in TERMINAL)
            progress.update(jobs_bar, completed=finished)
            if finished >= len(image_ids):
                return jobs
            if time.monotonic() > deadline:
                raise click.ClickException(f"not all jobs finished within {timeout_s:.0f}s: {jobs}")
            time.sleep(0.5)


def print_summary(console, jobs: dict[str, int], timings: dict[str, tuple[int, float]], elapsed: float) -> None:
    from rich.table import Table

    table = Table(title=f"jobs by status ({sum(jobs.values())} images, {elapsed:.1f}s)")
    table.add_column("status")
    table.add_column("jobs", justify="right")
    for status, n in sorted(jobs.items(), key=lambda kv: -kv[1]):
        table.add_row(status, str(n))
    console.print(table)
    table = Table(title="time per stage")
    for col in ("stage", "runs", "mean"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    from app.db.enums import STAGE_ORDER

    for stage in (s.value for s in STAGE_ORDER):
        runs, mean = timings.get(stage, (0, 0.0))
        table.add_row(stage, str(runs), f"{mean * 1000:.0f} ms")
    console.print(table)


def _hit_line(hit: dict[str, Any]):
    """One hit as rich Text: score, which signals found it, name, and the highlighted match (user
    text is never parsed as markup)."""
    from rich.text import Text

    from app.cli.search import highlighted, signals

    image = hit.get("image", {})
    line = Text(f"{hit.get('score', 0):.3f}  {signals(hit):<14} ")
    line.append(printable(image.get("display_name") or image.get("id")))
    line.append("  ")
    line.append_text(highlighted(hit))
    return line


def run_searches(console, api_url: str, near_duplicate_id: str | None) -> dict[str, list[dict]]:
    import requests
    from rich.text import Text

    results: dict[str, list[dict]] = {}
    for query in TEXT_QUERIES:
        resp = requests.get(f"{api_url}/api/v1/search/text", params={"q": query, "limit": 3}, timeout=60)
        resp.raise_for_status()
        results[query] = resp.json().get("items", [])
        console.print("[bold]text search[/bold]", Text(printable(repr(query))), "(hybrid: meaning + words)")
        for hit in results[query]:
            console.print("  ", _hit_line(hit))
    if near_duplicate_id:
        resp = requests.post(f"{api_url}/api/v1/search/visual", json={"image_id": near_duplicate_id, "limit": 3},
                             timeout=60)
        if resp.status_code == 422:  # limit not accepted in the body: ask without it
            resp = requests.post(f"{api_url}/api/v1/search/visual", json={"image_id": near_duplicate_id}, timeout=60)
        resp.raise_for_status()
        results["visual"] = resp.json().get("items", [])[:3]
        console.print(f"[bold]visual search[/bold] like {NEAR_DUPLICATE}")
        for hit in results["visual"]:
            console.print("  ", _hit_line(hit))
    return results


def library_banner(urls: dict[str, str], *, keep: bool, auth: str = "none") -> list[str]:
    """The demo's last lines: where the library page is, and whether it stays open."""
    line = f"Library {urls['library']}  — upload, search, look-alikes"
    if auth == "token":
        line += " (sign in with a token from `memeflow tokens create`)"
    if keep:
        return [line, "running; open the library in a browser, press Ctrl-C to stop"]
    return [line, "(the demo stops it now; `memeflow demo --keep` leaves it open until Ctrl-C)"]


@click.command()
@click.option("--keep", is_flag=True, help="keep everything running after the demo (Ctrl-C stops)")
@click.option("--images", "n_images", type=click.IntRange(1, 1000), default=None,
              help="use only the first N sample memes (default: all)")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True,
              help="seconds to wait for every job to finish")
@friendly_errors
def demo(keep: bool, n_images: int | None, timeout_s: float) -> None:
    """Run the whole pipeline on the bundled sample memes and show the results."""
    from rich.console import Console

    from app.cli.ingest import http_uploader, image_files, ingest_files
    from app.db.engine import make_engine
    from app.samples import generate_samples

    console = Console()
    settings = cli_settings()
    started = time.monotonic()
    console.rule("memeflow demo")
    console.print("starting PostgreSQL, Redis, API, workers (visual, agent, embedding), beat, Flower …")
    stack = start_stack(settings, lambda msg, **kw: console.print(markup_safe(msg)))
    try:
        urls = stack.urls()
        api_url = urls["api"].rstrip("/")
        sample_dir = Path(settings.var_dir).resolve() / "samples"
        generate_samples(sample_dir, limit=n_images)
        paths = image_files(sample_dir)
        console.print(f"generated {len(paths)} sample memes in {markup_safe(sample_dir)}; "
                      f"uploading through {api_url}/api/v1/images")
        report = ingest_files(paths, http_uploader(api_url))
        if report.failed:
            raise click.ClickException(printable(f"uploads failed: {report.failed}"))
        image_ids = list(report.image_ids.values())
        engine = make_engine(stack.database_url)
        try:
            t0 = time.monotonic()
            jobs = wait_until_terminal(engine, image_ids, console, timeout_s=timeout_s)
            print_summary(console, jobs, stage_timings(engine, image_ids), time.monotonic() - t0)
        finally:
            engine.dispose()
        run_searches(console, api_url, report.image_ids.get(NEAR_DUPLICATE))
        console.rule()
        console.print(f"API     {urls['api']}api/v1/images   (OpenAPI UI: {urls['api']}api/docs)")
        console.print(f"/ops    {urls['ops']}")
        if "flower" in urls:
            console.print(f"Flower  {urls['flower']}")
        console.print(f"demo finished in {time.monotonic() - started:.0f}s")
        for line in library_banner(urls, keep=keep, auth=settings.auth):
            console.print(markup_safe(line))
        if keep:
            from app.cli.stack import stop_on_signals

            stop = threading.Event()
            stop_on_signals(stop)  # Ctrl-C, kill, and the terminal closing (SIGHUP)
            stack.supervise(stop)
    finally:
        # once the terminal is gone (SIGHUP with --keep) printing fails; that must not skip the stop
        with contextlib.suppress(OSError, ValueError):
            console.print("stopping …")
        stack.stop()
        with contextlib.suppress(OSError, ValueError):
            console.print("stopped")
