"""``memeflow sweep`` (the reconcile sweep, once) and ``memeflow gc`` (unreferenced storage files,
and agent result records no attempt in flight needs)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from app.cli.common import connected, friendly_errors


@click.command()
@friendly_errors
def sweep() -> None:
    """Run the reconcile sweep once (what beat runs every MEMEFLOW_SWEEP_INTERVAL_S) and publish its hints."""
    from app.publisher import publisher_from_settings

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


def collect_garbage(orch, storage_dir: Path, *, min_age_s: float, dry_run: bool, now: float | None = None
                    ) -> GcReport:
    """Remove files no ``images.storage_key`` references, and stale temp files, older than ``min_age_s``.

    Each candidate file is decided under its storage key's lock (``orchestrator.files``): the
    references are re-read there and an upload of the same bytes holds that lock from its file
    check to its commit, so a file is never removed from under a row, however the two race. An
    upload refreshes an existing file's mtime, so ``min_age_s`` counts from the latest upload and
    also keeps uploads of older versions (which wrote the file before locking) safe.
    """
    from app.orchestrator.files import referenced_keys, remove_unreferenced_file
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
    referenced = referenced_keys(orch, keys)  # a lock-free first filter; each removal re-checks
    for key in keys:
        if key in referenced:
            continue
        if not old(store.path(key)):
            report.kept_young += 1
            continue
        removed = remove_unreferenced_file(orch, store, key, min_age_s=min_age_s, now=now, dry_run=dry_run)
        if removed is not None:
            report.orphans.append(store.path(key))
            report.bytes += removed
    for path in store.stale_temp_files():
        if not old(path):
            report.kept_young += 1
            continue
        try:
            report.bytes += path.stat().st_size
            if not dry_run:
                path.unlink()
            report.temp_files.append(path)
        except FileNotFoundError:
            pass
    return report


@click.command()
@click.option("--dry-run", is_flag=True, help="only report what would be removed")
@click.option("--min-age", "min_age_s", type=click.FloatRange(0), default=3600.0, show_default=True,
              help="keep files younger than this many seconds (counted from their latest upload)")
@friendly_errors
def gc(dry_run: bool, min_age_s: float) -> None:
    """Remove storage files no image references, temp files left by crashed writes, local agent
    result records whose attempt is no longer in flight, and thumbnails of versions no image has."""
    from app.stages.agent import records
    from app.thumbnails import THUMBS_DIR, ThumbnailCache, live_versions

    with connected() as ctx:
        storage = ctx.settings.storage_path
        report = collect_garbage(ctx.orch, storage, min_age_s=min_age_s, dry_run=dry_run)
        pruned = records.prune(ctx.settings.agent_results_path, ctx.orch.open_attempt_ids, min_age_s=min_age_s,
                               dry_run=dry_run)
        thumbs = ThumbnailCache(storage).prune(live_versions(ctx.orch.engine), min_age_s=min_age_s, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"gc {storage}: {verb} {len(report.orphans)} unreferenced files and {len(report.temp_files)} "
               f"temp files ({report.bytes} bytes); kept {report.kept_young} younger than {min_age_s:g}s")
    for path in (*report.orphans, *report.temp_files):
        click.echo(f"  {path}")
    click.echo(f"gc {ctx.settings.agent_results_path}: {verb} {len(pruned)} agent result records")
    click.echo(f"gc {storage / THUMBS_DIR}: {verb} {len(thumbs)} thumbnails of versions no image has")


@click.command("search-indexes")
@click.option("--maintenance-work-mem", default=None, help="For the builds, e.g. 1GB (default: the server's).")
@click.option("--min-images", type=int, default=None,
              help="Index scopes above this many images [default: the exact-scan size, 20,000].")
@friendly_errors
def search_indexes(maintenance_work_mem: str | None, min_images: int | None) -> None:
    """Give every scope above the exact-scan size (and below half of all images) its own partial
    HNSW index of the configured text and visual models, built CONCURRENTLY (writes go on).

    A filtered scan of the shared index misses a mid-size scope's neighbours (docs/performance.md
    §8); run this after a scope grows past the exact-scan size or the model changes (a cron job or
    after bulk imports). Idempotent: existing valid indexes are kept, interrupted builds redone."""
    from app.db.engine import ensure_scope_vector_indexes
    from app.search.queries import EXACT_SCAN_MAX_IMAGES

    threshold = EXACT_SCAN_MAX_IMAGES if min_images is None else min_images
    with connected() as ctx:
        cfg = ctx.orch.stage_configs
        for table, model, dims in (("text_embeddings", str(cfg.text["model"]), int(cfg.text["dims"])),
                                   ("visual_embeddings", str(cfg.visual["model"]), int(cfg.visual["dims"]))):
            started = time.monotonic()
            built = ensure_scope_vector_indexes(ctx.engine, table, model, dims, min_images=threshold,
                                                maintenance_work_mem=maintenance_work_mem)
            click.echo(f"{table} ({model}): {len(built)} scope index(es) built in {time.monotonic() - started:.1f}s"
                       + (f": {', '.join(built)}" if built else ""))
