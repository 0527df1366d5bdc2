"""``memeflow sweep`` (the reconcile sweep, once) and ``memeflow gc`` (unreferenced storage files)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import click
from sqlalchemy import text

from app.cli.common import connected, friendly_errors


@click.command()
@friendly_errors
def sweep() -> None:
    """Run the reconcile sweep once (what beat runs every MEMEFLOW_SWEEP_INTERVAL_S) and publish its hints."""
    from app.worker.publisher import publisher_from_settings

    with connected() as ctx:
        report = ctx.orch.sweep()
        publisher_from_settings(ctx.settings).publish(report.hints)  # after the sweep's commits
    if report.skipped:
        click.echo("another sweep holds the lock; nothing done")
        return
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())) or "nothing due"
    click.echo(f"sweep: {counts}; hints published {len(report.hints)}")


@dataclass
class GcReport:
    orphans: list[Path] = field(default_factory=list)
    temp_files: list[Path] = field(default_factory=list)
    bytes: int = 0
    kept_young: int = 0


def _referenced(engine, keys: list[str]) -> set[str]:
    """Which of ``keys`` an image row (any scope) references."""
    if not keys:
        return set()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT storage_key FROM images WHERE storage_key = ANY(:keys)"), {"keys": keys})
        return {r[0] for r in rows}


def collect_garbage(engine, storage_dir: Path, *, min_age_s: float, dry_run: bool, now: float | None = None
                    ) -> GcReport:
    """Remove files no ``images.storage_key`` references, and stale temp files, older than ``min_age_s``.

    An upload writes its file before its row commits, so a young unreferenced file may be in
    flight: only files older than ``min_age_s`` go. The references are read after the listing,
    so a file whose row committed meanwhile is seen as referenced.
    """
    from app.storage import FileStore

    store = FileStore(storage_dir)
    now = time.time() if now is None else now
    report = GcReport()

    def old(path: Path) -> bool:
        try:
            return now - path.stat().st_mtime >= min_age_s
        except FileNotFoundError:
            return False

    keys = list(store.iter_keys())
    referenced = _referenced(engine, keys)
    for key in keys:
        if key in referenced:
            continue
        path = store.path(key)
        if old(path):
            report.orphans.append(path)
        else:
            report.kept_young += 1
    for path in store.stale_temp_files():
        if old(path):
            report.temp_files.append(path)
        else:
            report.kept_young += 1
    # re-check right before deleting: a row may have been inserted for a key since the listing
    still_referenced = _referenced(engine, [f"{p.parent.name}/{p.name}" for p in report.orphans])
    report.orphans = [p for p in report.orphans if f"{p.parent.name}/{p.name}" not in still_referenced]
    for path in (*report.orphans, *report.temp_files):
        try:
            report.bytes += path.stat().st_size
            if not dry_run:
                path.unlink()
        except FileNotFoundError:
            pass
    return report


@click.command()
@click.option("--dry-run", is_flag=True, help="only report what would be removed")
@click.option("--min-age", "min_age_s", type=click.FloatRange(0), default=3600.0, show_default=True,
              help="keep files younger than this many seconds (uploads in flight)")
@friendly_errors
def gc(dry_run: bool, min_age_s: float) -> None:
    """Remove storage files no image references, and temp files left by crashed writes."""
    with connected() as ctx:
        storage = ctx.settings.storage_path
        report = collect_garbage(ctx.engine, storage, min_age_s=min_age_s, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"gc {storage}: {verb} {len(report.orphans)} unreferenced files and {len(report.temp_files)} "
               f"temp files ({report.bytes} bytes); kept {report.kept_young} younger than {min_age_s:g}s")
    for path in (*report.orphans, *report.temp_files):
        click.echo(f"  {path}")
