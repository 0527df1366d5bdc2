"""``memeflow sweep`` (the reconcile sweep, once) and ``memeflow gc`` (unreferenced storage files,
and agent result records no attempt in flight needs)."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import click

from app.cli.common import Seconds, connected, friendly_errors


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
    for failed in report.failed_steps:
        click.echo(f"sweep step {failed['step']} failed: {failed['error']} (the other steps ran)", err=True)


#: storage keys (and thumbnails) gc reads and checks against the database at a time
GC_CHUNK = 1000


@dataclass
class GcReport:
    orphans: list[Path] = field(default_factory=list)
    temp_files: list[Path] = field(default_factory=list)
    bytes: int = 0
    kept_young: int = 0
    foreign: list[str] = field(default_factory=list)  # namespace directories no scope of the database owns
    failed: list[tuple[Path, OSError]] = field(default_factory=list)  # removals the filesystem refused


def collect_garbage(orch, storage_dir: Path, *, min_age_s: float, dry_run: bool, now: float | None = None,
                    owned: Collection[str] | None = None) -> GcReport:
    """Remove files no ``images.storage_key`` references, and temp files of crashed writes (never one
    a live write holds: ``app.atomic``), older than ``min_age_s``.

    Only in the namespace directories of this database's scopes (``owned``; read from it when not
    given): the rows of a database that does not own the storage directory (a wrong
    MEMEFLOW_DATABASE_URL, a fresh or restored database) reference none of its files, so every other
    directory is left alone and listed in ``foreign``.

    Each candidate file is decided under its storage key's lock (``orchestrator.files``): the
    references are re-read there and an upload of the same bytes holds that lock from its file
    check to its commit, so a file is never removed from under a row, however the two race. An
    upload refreshes an existing file's mtime, so ``min_age_s`` counts from the latest upload and
    also keeps uploads of older versions (which wrote the file before locking) safe.

    A removal the filesystem refuses (read-only mount, permissions) is listed in ``failed`` and the
    pass goes on.
    """
    from app.atomic import remove_abandoned_temp
    from app.orchestrator.files import owned_namespaces, referenced_keys, remove_unreferenced_file
    from app.storage import FileStore

    store = FileStore(storage_dir)
    now = time.time() if now is None else now
    report = GcReport()

    def old(path: Path) -> bool:
        try:
            return now - path.stat().st_mtime >= min_age_s
        except FileNotFoundError:
            return False

    owned = owned_namespaces(orch) if owned is None else owned
    all_temps = store.stale_temp_files()
    temps = [p for p in all_temps if p.parent.name in owned]
    on_disk = store.namespaces()
    mine = [ns for ns in on_disk if ns in owned]
    report.foreign = sorted({p.parent.name for p in all_temps if p.parent.name not in owned}
                            | {ns for ns in on_disk if ns not in owned and any(True for _ in store.iter_keys([ns]))})
    keys = store.iter_keys(mine)  # streamed: memory and each query bounded by GC_CHUNK, whatever the library
    while chunk := list(itertools.islice(keys, GC_CHUNK)):
        referenced = referenced_keys(orch, chunk)  # a lock-free first filter; each removal re-checks
        for key in chunk:
            if key in referenced:
                continue
            if not old(store.path(key)):
                report.kept_young += 1
                continue
            try:
                removed = remove_unreferenced_file(orch, store, key, min_age_s=min_age_s, now=now, dry_run=dry_run)
            except OSError as exc:
                report.failed.append((store.path(key), exc))
                continue
            if removed is not None:
                report.orphans.append(store.path(key))
                report.bytes += removed
    for path in temps:
        if not old(path):
            report.kept_young += 1
            continue
        try:
            size = path.stat().st_size
            if not remove_abandoned_temp(path, dry_run=dry_run):  # a live write's: kept
                continue
            report.bytes += size
            report.temp_files.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            report.failed.append((path, exc))
    return report


@click.command()
@click.option("--dry-run", is_flag=True, help="only report what would be removed")
@click.option("--min-age", "min_age_s", type=Seconds(0), default=3600.0, show_default=True,
              help="keep files younger than this many seconds (counted from their latest upload)")
@friendly_errors
def gc(dry_run: bool, min_age_s: float) -> None:
    """Remove storage files no image references, temp files left by crashed writes, local agent
    result records whose attempt is no longer in flight, and thumbnails of versions no image has —
    each only in the storage namespaces of this database's scopes. Exit 1 if the filesystem refused
    a removal (each one is listed; the rest of the pass ran)."""
    from app.orchestrator.files import owned_namespaces
    from app.stages.agent import records
    from app.thumbnails import THUMBS_DIR, ThumbnailCache, live_versions_among

    with connected() as ctx:
        storage = ctx.settings.storage_path
        owned = owned_namespaces(ctx.orch)
        report = collect_garbage(ctx.orch, storage, min_age_s=min_age_s, dry_run=dry_run, owned=owned)
        results_dirs = list(dict.fromkeys((ctx.settings.agent_results_path, ctx.settings.legacy_agent_results_path)))
        failed = report.failed
        pruned = {d: records.prune(d, ctx.orch.open_attempt_ids, min_age_s=min_age_s, dry_run=dry_run,
                                   namespaces=owned, failed=failed)
                  for d in results_dirs}
        thumbs = ThumbnailCache(storage).prune(functools.partial(live_versions_among, ctx.orch.engine),
                                               min_age_s=min_age_s, dry_run=dry_run, namespaces=owned, failed=failed,
                                               chunk=GC_CHUNK)
    if report.foreign:
        click.echo(f"warning: {storage} has namespaces not owned by this database, left alone: "
                   f"{', '.join(report.foreign)} (is MEMEFLOW_DATABASE_URL this storage's database?)", err=True)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"gc {storage}: {verb} {len(report.orphans)} unreferenced files and {len(report.temp_files)} "
               f"temp files ({report.bytes} bytes); kept {report.kept_young} younger than {min_age_s:g}s")
    for path in (*report.orphans, *report.temp_files):
        click.echo(f"  {path}")
    for results_dir, removed in pruned.items():
        if removed or results_dir == ctx.settings.agent_results_path:  # the legacy dir only when it had some
            click.echo(f"gc {results_dir}: {verb} {len(removed)} agent result records")
    click.echo(f"gc {storage / THUMBS_DIR}: {verb} {len(thumbs)} thumbnails of versions no image has")
    for path, exc in failed:
        click.echo(f"error: could not remove {path}: {exc.strerror or exc}", err=True)
    if failed:
        click.echo(f"error: {len(failed)} file(s) could not be removed (is the storage mounted read-only, "
                   "or owned by another user?)", err=True)
        raise SystemExit(1)


@click.command("search-indexes")
@click.option("--maintenance-work-mem", default=None,
              help="For the builds, e.g. 1GB (default: MEMEFLOW_SEARCH_INDEX_MAINTENANCE_WORK_MEM, else the server's).")
@click.option("--min-images", type=click.IntRange(0), default=None,
              help="Index scopes above this many images [default: MEMEFLOW_SEARCH_INDEX_MIN_IMAGES, else the "
                   "exact-scan size, 20,000].")
@friendly_errors
def search_indexes(maintenance_work_mem: str | None, min_images: int | None) -> None:
    """One pass of the per-scope HNSW index maintenance that beat runs every
    MEMEFLOW_SEARCH_INDEX_INTERVAL_S (app/orchestrator/scope_indexes.py): every scope above the
    exact-scan size (and below half of all images) gets its own partial index of each model its
    search reads, built CONCURRENTLY (writes go on); invalid indexes (interrupted builds) and those
    of deleted scopes or models no longer served are dropped. Idempotent; waits for a pass that
    runs elsewhere. Exit 1 if a build failed."""
    from app.orchestrator.scope_indexes import TABLES, InvalidWorkMem, maintain

    with connected() as ctx:
        started = time.monotonic()
        try:
            report = maintain(ctx.orch, min_images_override=min_images, maintenance_work_mem=maintenance_work_mem,
                              wait=True)
        except InvalidWorkMem as exc:
            if maintenance_work_mem is None:  # the setting's value
                raise click.ClickException(f"MEMEFLOW_SEARCH_INDEX_MAINTENANCE_WORK_MEM: {exc}") from None
            raise click.BadParameter(str(exc), param_hint="--maintenance-work-mem") from None
    elapsed = time.monotonic() - started
    for table in TABLES.values():
        built = [n for n in report.built if n.startswith(f"ix_{table}_")]
        dropped = [n for n in report.dropped if n.startswith(f"ix_{table}_")]
        click.echo(f"{table}: {len(built)} scope index(es) built, {len(dropped)} dropped"
                   + (f"; built {', '.join(built)}" if built else "") + (f"; dropped {', '.join(dropped)}" if dropped else ""))
    click.echo(f"done in {elapsed:.1f}s")
    if report.failed:
        click.echo(f"failed (logged; the next pass retries): {', '.join(report.failed)}", err=True)
        raise SystemExit(1)
