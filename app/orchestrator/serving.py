"""Changing a text (or visual) model without a search outage: each scope's search serving state
(migration 0017), one row per (scope, kind).

Per scope and kind (text, visual), ``search_serving`` names the model its search reads (*serving*). When the configured
model differs — and sweeps have seen it differ, none agreeing, for ``search_config_grace_s``: during a
rolling restart sweeps of the old and the new configuration run side by side
(store/serving_attention.py) — the sweep starts a *backfill*: the configured model becomes the
*target*, a fill batch (a library batch seeding only the images that lack it, resumable, with the
batches' back-pressure) computes it, and meanwhile

- search keeps answering from the serving model — only rows current for the image's sha256 and
  metadata_hash, as always;
- every text (visual) task of the scope embeds with the serving and the target model (the stage is
  valid only when both exist: ``store.serving_fill.SERVING_TEXT_MISSING``/``SERVING_VISUAL_MISSING``),
  so uploads and context edits during the backfill land in both.

When every image with a context has a current row of the target, the reads switch in ONE
conditional UPDATE (``store.serving.cutover_txn``: epoch + 1; racing workers and sweeps — exactly
one wins). An operator can cut over early, roll back (serve the previous model again, pinned), or
resume. Rows of a model that is none of serving/target/previous-in-window are prunable
(``store.serving_fill.PRUNABLE_TEXT_EMBEDDINGS``; the retention hooks are in serving_reads.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from app import metrics
from app.db.engine import read_connection
from app.db.enums import BatchStatus, ServingAction, ServingState
from app.orchestrator import batches
from app.orchestrator.errors import ServingStateConflict
from app.orchestrator.hints import Hint
from app.orchestrator.serving_reads import (
    KINDS,
    TEXT,
    check_kind,
    configured_ref,
    coverage_txn,
    same,
    slot,
    states_seen,
    status,
)
from app.orchestrator.store import batches as batches_q
from app.orchestrator.store import serving as q
from app.orchestrator.store import serving_attention as attention

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)
SWEEP_SCOPES = 50  # rows bootstrapped / acted on per sweep run


# ---------------------------------------------------------------------------- the switch
def after_completions(orch: Orchestrator, scope_ids: list[str], kind: str, claims: list | None = None) -> None:
    """After completions committed: a scope in backfill may be covered now — try its cutover
    (throttled per scope by ``search_cutover_check_s``, so racing workers scan it once).

    ``claims``: the completed claims; when this thread's extra-models read saw none of their
    scopes in a backfill (``serving_reads.states_seen``), there is nothing to check and no read."""
    seen = states_seen(claims) if claims else None
    if seen is not None and ServingState.BACKFILL not in seen:
        return
    with read_connection(orch.engine) as conn:  # autocommit: no ROLLBACK (app/db/engine.py)
        rows = q.serving_many_txn(conn, scope_ids, kind)
    for scope_id, row in rows.items():
        if row["state"] == ServingState.BACKFILL:
            try:
                try_cutover(orch, scope_id, kind=kind)
            except Exception:  # noqa: BLE001 - never fail a completion that committed; the sweep retries
                log.exception("cutover check failed", extra={"scope_id": scope_id})


def try_cutover(orch: Orchestrator, scope_id: str, *, kind: str = TEXT, force_check: bool = False) -> bool:
    """Switch the scope's reads to its target if the target covers every image that needs it.
    True only for the one call that switched."""
    return _check(orch, scope_id, kind, force_check) == SWITCHED


SWITCHED, GAP, SKIPPED = "switched", "gap", "skipped"


def _check(orch: Orchestrator, scope_id: str, kind: str, force_check: bool = False) -> str:
    """One cutover check: SWITCHED (this call switched the reads), GAP (checked: an image still
    lacks the target) or SKIPPED (throttled, seeding, or not in a backfill any more)."""
    now = orch.now()
    interval = 0.0 if force_check else orch.settings.search_cutover_check_s
    with orch.engine.begin() as conn:
        checked = q.claim_check_txn(conn, scope_id, kind, now, interval)
        if not checked.matched:  # throttled, seeding, or no longer in a backfill: nothing to do
            return SKIPPED
        row = checked.row
        target = slot(row, "target")
        # the conditional UPDATE first: its NOT EXISTS stops at the first image still lacking the target
        cut = q.cutover_txn(conn, scope_id, kind=kind, target=target["model"], target_dims=target["dims"],
                            target_pv=target.get("preprocess_version"), early=False, now=now)
        if not cut.matched:  # an image still lacks the target (the check row is ours: no race)
            # the stored progress (search responses, the overview) is refreshed at a tenth of the rate:
            # counting is a whole-scope scan even when the gap is found at once
            stale = row["coverage_at"] is None or (now - row["coverage_at"]).total_seconds() >= 10 * interval
            if stale:
                coverage = coverage_txn(conn, scope_id, kind, target)
                q.set_coverage_txn(conn, scope_id, kind, coverage["ready"], coverage["total"], now)
            return GAP
        coverage = coverage_txn(conn, scope_id, kind, target)
        _switched_txn(conn, cut.row, ServingAction.CUTOVER, coverage, now)
    metrics.SEARCH_SWITCHES.labels(kind, ServingAction.CUTOVER.value).inc()
    log.info("search cutover", extra={"scope_id": scope_id, "code": f"{kind}:{cut.row['serving_model']}"})
    return SWITCHED


def _switched_txn(conn: Connection, row: Any, action: str, coverage: dict, now) -> None:
    q.record_event_txn(conn, row["scope_id"], row["kind"], action, row["epoch"], from_model=row["previous_model"],
                       to_model=row["serving_model"], now=now, detail={"coverage": coverage})
    q.set_coverage_txn(conn, row["scope_id"], row["kind"], coverage["ready"], coverage["total"], now)


# ---------------------------------------------------------------------------- the sweep step
def reconcile(orch: Orchestrator, errors: list[BaseException] | None = None) -> tuple[dict[str, int], list[Hint]]:
    """Sweep step, per kind: give new scopes a serving row (served by the configured model), start a
    backfill where the configured model changed, retarget or abort one whose target is no longer
    configured — each once sweeps have disagreed so for ``search_config_grace_s`` — attach fill
    batches, and try the cutover of scopes whose fill is done.

    Each kind and each scope's work runs isolated: one that raises is logged and appended to
    ``errors`` and the others go on — a scope whose action raised at every sweep (a custom policy
    raising for its tenant as its fill batch is seeded) otherwise ended the step first, and the
    scopes behind it, and the whole visual kind, were never reconciled. A lost database connection
    still ends the step (it fails every scope alike). ``errors`` None: the first error is raised
    once every scope was tried."""
    told = [] if errors is None else errors
    counts = {"serving_bootstrapped": 0, "backfills_started": 0, "cutovers": 0}
    hints: list[Hint] = []
    for kind in KINDS:
        hints += _isolated(told, kind, None, _reconcile_kind, orch, kind, counts, told) or []
    if errors is None and told:
        raise told[0]
    return counts, hints


def _isolated(errors: list[BaseException], kind: str, scope_id: str | None, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None if it raised: logged and appended to ``errors`` (the next sweep tries
    again). A lost connection is raised: the database is gone for every scope."""
    try:
        return fn(*args)
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise
        log.exception("serving reconcile failed", extra={"scope_id": scope_id, "code": kind})
        errors.append(exc)
    except Exception as exc:  # noqa: BLE001 - isolate the scope; the next sweep tries it again
        log.exception("serving reconcile failed", extra={"scope_id": scope_id, "code": kind})
        errors.append(exc)
    return None


def _reconcile_kind(orch: Orchestrator, kind: str, counts: dict[str, int], errors: list[BaseException]) -> list[Hint]:
    hints: list[Hint] = []
    ref = configured_ref(orch, kind)
    now = orch.now()
    with orch.engine.connect() as conn:
        new_scopes = q.scopes_without_serving_txn(conn, kind, SWEEP_SCOPES)
    for scope_id in new_scopes:  # each in its own transaction: one that raises leaves the others bootstrapped
        _isolated(errors, kind, scope_id, _bootstrap, orch, scope_id, kind, ref, now, counts)
    with orch.engine.begin() as conn:
        # agreeing with a row's direction resets the clock of the sweeps that disagree (a rolling restart)
        attention.clear_disagreement_txn(conn, kind, ref)  # matched or not: nothing else to do
        # attended now: a row whose action raises goes to the back of the window, not ahead of the others
        rows = sorted(attention.attend_txn(conn, kind, ref, SWEEP_SCOPES, now).rows, key=lambda r: r["scope_id"])
    for row in rows:
        hints += _isolated(errors, kind, row["scope_id"], _reconcile_row, orch, row, kind, ref, now, counts) or []
    return hints


def _bootstrap(orch: Orchestrator, scope_id: str, kind: str, ref: dict[str, Any], now, counts: dict[str, int]) -> None:
    """A scope without a serving row of ``kind``: served by the configured model ``ref``."""
    with orch.engine.begin() as conn:
        bootstrapped = q.bootstrap_txn(conn, scope_id, kind, ref, now).matched  # else: a concurrent bootstrap won
        if bootstrapped:
            q.record_event_txn(conn, scope_id, kind, ServingAction.BOOTSTRAP, 0, from_model=None,
                               to_model=ref["model"], now=now)
    counts["serving_bootstrapped"] += int(bootstrapped)


def _reconcile_row(orch: Orchestrator, row: Any, kind: str, ref: dict[str, Any], now,
                   counts: dict[str, int]) -> list[Hint]:
    """One attended row: start a backfill (serving, the configured model differs), or move its
    backfill on (retarget/abort, attach a fill, check the cutover, refill)."""
    scope_id = row["scope_id"]
    if row["state"] == ServingState.SERVING:
        started = None
        with orch.engine.begin() as conn:
            if _disagreement_due_txn(orch, conn, row, ref, now):
                begun = q.begin_backfill_txn(conn, scope_id, kind, ref, from_model=row["serving_model"], now=now)
                started = begun.row  # None: pinned or switched meanwhile (a lost race) — nothing to start
            if started is not None:
                q.record_event_txn(conn, scope_id, kind, ServingAction.BACKFILL, started["epoch"],
                                   from_model=row["serving_model"], to_model=ref["model"], now=now)
                counts["backfills_started"] += 1
        # a fill that raises here is attached by a later sweep (a backfill without a batch_id)
        return _start_fill(orch, scope_id, kind, ref) if started is not None else []
    # backfill
    if not same(ref, slot(row, "target")):
        return _target_changed(orch, row, ref)
    if row["batch_id"] is None:
        return _start_fill(orch, scope_id, kind, ref)
    outcome = _check(orch, scope_id, kind)
    if outcome == SWITCHED:
        counts["cutovers"] += 1
    elif outcome == GAP:  # verified just now: the fill, if finished, left images uncovered
        return _maybe_refill(orch, row, ref)
    return []


def _disagreement_due_txn(orch: Orchestrator, conn: Connection, row: Any, ref: dict[str, Any], now) -> bool:
    """Note that this sweep's configured model ``ref`` disagrees with ``row``'s direction; True when
    the disagreement has lasted ``search_config_grace_s`` (no agreeing sweep in between) and this
    transaction may act on it — the row stays locked until it commits. A rolling restart runs old-
    and new-configuration sweeps side by side: without the grace each undid the other's change."""
    noted = attention.note_disagreement_txn(conn, row, ref, now, orch.settings.search_config_grace_s)
    return noted.matched and bool(noted.row["due"])  # not matched: the row moved since it was read


def _fill_models(row: Any, kind: str, ref: dict[str, Any]) -> list[dict[str, Any]]:
    models = [ref]
    for name in ("serving", "target"):
        other = slot(row, name) if row is not None else None
        if other and not any(same(m, other) for m in models):
            models.append(other)
    return [{"kind": kind, "model": m["model"], "dims": int(m["dims"]),
             "preprocess_version": m.get("preprocess_version")} for m in models]


def _start_fill(orch: Orchestrator, scope_id: str, kind: str, ref: dict[str, Any]) -> list[Hint]:
    """Create the fill batch of a backfill towards ``ref`` attached in the same transaction (a
    concurrent change of the state: nothing is created), then seed its first page.

    Attached before any page is seeded: a first page that raised (a custom policy raising for the
    tenant) left a committed batch unattached, and every sweep created another; now the sweep's
    batch step seeds it once it can (``batches.continue_batches``)."""
    now = orch.now()
    with orch.engine.connect() as conn:
        row = q.serving_txn(conn, scope_id, kind)
        if row is None or not same(ref, slot(row, "target")):
            return []
        batch = batches.create_batch_txn(orch, conn, scope_id, all=True, fill_models=_fill_models(row, kind, ref))
        if not q.set_batch_txn(conn, scope_id, kind, batch["id"], target=ref["model"], now=now).matched:
            conn.rollback()  # the backfill ended or was retargeted meanwhile: no batch
            return []
        # the progress /ops and the CLI overview show until the first cutover check
        cov = coverage_txn(conn, scope_id, kind, ref)
        q.set_coverage_txn(conn, scope_id, kind, cov["ready"], cov["total"], now)
        conn.commit()
    _, hints = batches.seed_batch(orch, batch["id"], max_pages=1, page_size=1)  # a prompt start
    return hints


def _maybe_refill(orch: Orchestrator, row: Any, ref: dict[str, Any]) -> list[Hint]:
    """A fill batch that finished but left images uncovered (their jobs failed, or were owned by an
    older configuration's job) is seeded again, up to ``search_fill_rounds`` times; then the scope
    waits for an operator (cut over early, or roll back)."""
    with orch.engine.connect() as conn:
        batch = batches_q.batch_txn(conn, row["batch_id"])
    if batch is not None and batch["status"] in (BatchStatus.SEEDING, BatchStatus.RUNNING):
        return []
    if row["fill_rounds"] >= orch.settings.search_fill_rounds:
        return []
    with orch.engine.begin() as conn:
        q.record_event_txn(conn, row["scope_id"], row["kind"], ServingAction.REFILL, row["epoch"],
                           from_model=row["serving_model"], to_model=row["target_model"], now=orch.now(),
                           detail={"round": row["fill_rounds"] + 1, "coverage": {"ready": row["ready"],
                                                                              "total": row["total"]}})
    return _start_fill(orch, row["scope_id"], row["kind"], ref)


def _target_changed(orch: Orchestrator, row: Any, ref: dict[str, Any]) -> list[Hint]:
    """The configuration changed again during a backfill: back to serving if it is the serving model
    again (abort), else towards the new model (retarget) — once the disagreement has lasted the
    grace (``_disagreement_due_txn``). The old fill batch is cancelled."""
    scope_id, kind, now = row["scope_id"], row["kind"], orch.now()
    with orch.engine.begin() as conn:
        if not _disagreement_due_txn(orch, conn, row, ref, now):
            return []
        if same(ref, slot(row, "serving")):
            done = q.end_backfill_txn(conn, scope_id, kind, state=ServingState.SERVING,
                                      from_target=row["target_model"], now=now).row
            action = ServingAction.ABORT
        else:
            done = q.retarget_txn(conn, scope_id, kind, ref, from_target=row["target_model"], now=now).row
            action = ServingAction.RETARGET
        # done is None (not matched): another sweep or an operator changed the row first — nothing to do
        if done is not None:
            q.record_event_txn(conn, scope_id, kind, action, done["epoch"], from_model=row["target_model"],
                               to_model=ref["model"], now=now)
    if done is None:
        return []
    _cancel(orch, scope_id, row["batch_id"])
    return _start_fill(orch, scope_id, kind, ref) if action == ServingAction.RETARGET else []


def _cancel(orch: Orchestrator, scope_id: str, batch_id: uuid.UUID | None) -> None:
    if batch_id is not None:
        orch.cancel_batch(scope_id, batch_id)


# ---------------------------------------------------------------------------- operators
def cutover_early(orch: Orchestrator, scope_id: str, kind: str = TEXT) -> dict[str, Any]:
    """Serve the target now, whatever its coverage: images it lacks are found by their words only
    until the fill covers them — so the scope's fill batch, detached from the state by the switch,
    goes on (cancelling it left them without the served model for good: nothing else fills a scope
    served by the configured model)."""
    kind, now = check_kind(kind), orch.now()
    with orch.engine.begin() as conn:
        row = q.serving_txn(conn, scope_id, kind)
        if row is None or row["state"] != ServingState.BACKFILL:
            raise ServingStateConflict("the scope's search is not in a backfill; nothing to cut over to")
        target = slot(row, "target")
        coverage = coverage_txn(conn, scope_id, kind, target)
        cut = q.cutover_txn(conn, scope_id, kind=kind, target=target["model"], target_dims=target["dims"],
                            target_pv=target.get("preprocess_version"), early=True, now=now)
        if not cut.matched:
            raise ServingStateConflict("the scope's serving state changed meanwhile; look again")
        _switched_txn(conn, cut.row, ServingAction.EARLY_CUTOVER, coverage, now)
    metrics.SEARCH_SWITCHES.labels(kind, ServingAction.EARLY_CUTOVER.value).inc()
    return status(orch, scope_id, kind)


def rollback(orch: Orchestrator, scope_id: str, kind: str = TEXT) -> tuple[dict[str, Any], list[Hint]]:
    """During a backfill: abort it (the reads never moved). After a cutover: serve the previous model
    again (epoch + 1) and fill it for images added since. Either way the scope is pinned: no new
    backfill starts until ``resume``.

    The switch back and its fill batch commit together: a process killed right after the switch
    left the previous model's gaps (images added since the cutover) with nothing to fill them — a
    pinned scope starts no backfill. A committed batch is seeded by the sweep if this call does not
    get to seed its first page."""
    kind, now = check_kind(kind), orch.now()
    hints: list[Hint] = []
    fill = None
    with orch.engine.begin() as conn:
        row = q.serving_txn(conn, scope_id, kind)
        if row is None:
            raise ServingStateConflict("the scope has no search serving state yet")
        if row["state"] == ServingState.BACKFILL:
            done = q.end_backfill_txn(conn, scope_id, kind, state=ServingState.PINNED, from_target=None, now=now).row
            if done is None:
                raise ServingStateConflict("the scope's serving state changed meanwhile; look again")
            q.record_event_txn(conn, scope_id, kind, ServingAction.ABORT, done["epoch"],
                               from_model=row["target_model"], to_model=row["serving_model"], now=now)
            cancel, switched_back = row["batch_id"], False
        else:
            done = q.rollback_txn(conn, scope_id, kind, epoch=row["epoch"], now=now,
                                  kept_since=_rollback_kept_since(orch, now)).row
            if done is None:
                if row["previous_model"] is not None:
                    raise ServingStateConflict(
                        "the previous model was replaced longer ago than MEMEFLOW_SEARCH_ROLLBACK_WINDOW_S and old-model"
                        " retention may have pruned its embeddings; configure it again instead (a backfill, no outage)")
                raise ServingStateConflict("nothing to roll back to: the scope has served one model only")
            coverage = coverage_txn(conn, scope_id, kind, slot(done, "serving"))
            _switched_txn(conn, done, ServingAction.ROLLBACK, coverage, now)
            cancel, switched_back = None, True
            if coverage["ready"] < coverage["total"]:  # images added since the cutover: embed them with it too
                models = _fill_models(done, kind, configured_ref(orch, kind))
                fill = batches.create_batch_txn(orch, conn, scope_id, all=True, fill_models=models)
    if switched_back:
        metrics.SEARCH_SWITCHES.labels(kind, ServingAction.ROLLBACK.value).inc()
    _cancel(orch, scope_id, cancel)
    if fill is not None:  # its first page now, for a prompt start; the sweep seeds the rest
        _, hints = batches.seed_batch(orch, fill["id"], max_pages=1, page_size=1)
    return status(orch, scope_id, kind), hints


def _rollback_kept_since(orch: Orchestrator, now) -> Any:
    """The earliest switch whose previous model's rows are surely kept: with old-model retention on
    (``retention_old_models_s``), a replaced model's rows go once ``search_rollback_window_s`` has
    passed since the switch (store/retention.py); without it they are kept (None: any switch)."""
    if orch.settings.retention_old_models_s <= 0:
        return None
    return now - timedelta(seconds=orch.settings.search_rollback_window_s)


def resume(orch: Orchestrator, scope_id: str, kind: str = TEXT) -> dict[str, Any]:
    """Unpin: the sweep starts a backfill towards the configured model if it differs."""
    kind, now = check_kind(kind), orch.now()
    with orch.engine.begin() as conn:
        done = q.resume_txn(conn, scope_id, kind, now).row
        if done is None:
            raise ServingStateConflict("the scope's search is not pinned")
        q.record_event_txn(conn, scope_id, kind, ServingAction.RESUME, done["epoch"], from_model=None,
                           to_model=done["serving_model"], now=now)
    return status(orch, scope_id, kind)


