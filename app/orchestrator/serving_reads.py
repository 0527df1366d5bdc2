"""What workers, the search surfaces and retention read about the search serving states
(app/orchestrator/serving.py switches them): model refs, the extra models a task must compute, the
prunable rows of replaced models, and the states as the API, /ops and the CLI show them."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from app.db.enums import ServingKind, Stage
from app.orchestrator.store import serving as q
from app.orchestrator.store import serving_fill

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator
    from app.orchestrator.types import Claim

TEXT, VISUAL = ServingKind.TEXT.value, ServingKind.VISUAL.value
KINDS = (TEXT, VISUAL)


def configured_ref(orch: Orchestrator, kind: str) -> dict[str, Any]:
    """The model new jobs are configured with, as a model ref (spec + options rebuild it anywhere)."""
    from app.stages.providers import text_options, visual_options

    if kind == TEXT:
        cfg = dict(orch.stage_configs[Stage.TEXT_EMBEDDING])
        return {"spec": orch.settings.text_provider, "options": text_options(orch.settings),
                "model": str(cfg["model"]), "dims": int(cfg["dims"]), "config": cfg}
    cfg = dict(orch.stage_configs[Stage.VISUAL])
    return {"spec": orch.settings.visual_provider, "options": visual_options(orch.settings),
            "model": str(cfg["model"]), "dims": int(cfg["dims"]),
            "preprocess_version": str(cfg["preprocess_version"]), "config": cfg}


def ref_key(ref: dict[str, Any] | None) -> tuple | None:
    """What identifies a model's stored rows: (model, dims, preprocess_version or None)."""
    if not ref:
        return None
    return (str(ref["model"]), int(ref["dims"]), ref.get("preprocess_version"))


def slot(row: Any, name: str) -> dict[str, Any] | None:
    """The model ref held in ``serving``/``target``/``previous`` of a row."""
    return row[f"{name}_ref"] if row[f"{name}_model"] else None


def same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Do two model refs name the same stored rows?"""
    return a is not None and b is not None and ref_key(a) == ref_key(b)


# ---------------------------------------------------------------------------- workers
def extra_models_txn(
    orch: Orchestrator, conn: Connection, claims: list[Claim], kind: str
) -> dict[uuid.UUID, list[dict]]:
    """For each claim's image, the model refs its scope's serving state needs (serving, and target
    during a model change) that the image has no current embedding of yet; the executor drops the
    one its own provider computes anyway."""
    rows = q.serving_many_txn(conn, sorted({c.scope_id for c in claims}), kind)
    _remember_states(claims, rows)
    if not rows:
        return {}
    image_ids = [c.image_id for c in claims if c.scope_id in rows]
    if kind == TEXT:
        text_models = serving_fill.current_text_models_many_txn(conn, image_ids)
        have: dict = {k: {(m, d, None) for m, d in v} for k, v in text_models.items()}
    else:
        have = serving_fill.current_visual_models_many_txn(conn, image_ids)
    out: dict[uuid.UUID, list[dict]] = {}
    for claim in claims:
        row = rows.get(claim.scope_id)
        if row is None:
            continue
        needed: list[dict] = []
        for ref in (slot(row, "serving"), slot(row, "target")):
            if ref is None or ref_key(ref) in have.get(claim.image_id, set()) or any(same(ref, r) for r in needed):
                continue
            needed.append(ref)
        if needed:
            out[claim.image_id] = needed
    return out


#: Per thread: the serving state each claim of the last batch's extra-models read saw for its
#: scope, by (task id, generation) — a worker thread reads, computes and completes one batch.
_SEEN = threading.local()


def _remember_states(claims: list[Claim], rows: dict) -> None:
    _SEEN.states = {(c.task_id, c.generation): (rows[c.scope_id]["state"] if c.scope_id in rows else None)
                    for c in claims}


def states_seen(claims: list[Claim]) -> list[str | None] | None:
    """The serving state (None: no row) this thread's extra-models read saw for each claim's scope
    before computing it, or None when any claim was not read here (read them again then).
    ``serving.after_completions`` uses it to skip its read when no scope was in a backfill: a scope
    entering one after that read gets its cutover check from its next completion or the sweep, as
    it would for a completion that committed just before the backfill started."""
    states = getattr(_SEEN, "states", None) or {}
    try:
        return [states[(c.task_id, c.generation)] for c in claims]
    except KeyError:
        return None


def coverage_txn(conn: Connection, scope_id: str, kind: str, ref: dict[str, Any]) -> dict[str, int]:
    return q.coverage_txn(conn, scope_id, kind, ref["model"], ref["dims"], ref.get("preprocess_version"))



# ---------------------------------------------------------------------------- retention hook
def superseded_text_embeddings_txn(orch: Orchestrator, conn: Connection, limit: int) -> list[int]:
    """Ids of up to ``limit`` text embeddings no scope reads or may roll back to any more (a replaced
    model past ``search_rollback_window_s``), locked SKIP LOCKED for the caller's DELETE in the same
    transaction — what the retention sweep prunes after a model change."""
    keep_after = orch.now() - timedelta(seconds=orch.settings.search_rollback_window_s)
    return serving_fill.prunable_text_embeddings_txn(conn, keep_after, limit)


def superseded_visual_embeddings_txn(orch: Orchestrator, conn: Connection, limit: int) -> list[tuple]:
    """The same for visual embeddings: their keys (scope_id, image_id, model, preprocess_version, image_sha256)."""
    keep_after = orch.now() - timedelta(seconds=orch.settings.search_rollback_window_s)
    return serving_fill.prunable_visual_embeddings_txn(conn, keep_after, limit)


# ---------------------------------------------------------------------------- reads
def check_kind(kind: str) -> str:
    if kind not in KINDS:
        from app.orchestrator.errors import InvalidRequest

        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", code="invalid_kind")
    return kind


def describe(row: Any, *, serving_coverage: dict | None = None, target_coverage: dict | None = None) -> dict[str, Any]:
    """A serving row as the API, /ops and the CLI show it."""
    target = None
    if row["target_model"]:
        target = {"model": row["target_model"], "dims": row["target_dims"],
                  "coverage": target_coverage or {"ready": row["ready"], "total": row["total"]},
                  "batch_id": str(row["batch_id"]) if row["batch_id"] else None, "fill_rounds": row["fill_rounds"]}
    return {
        "scope_id": row["scope_id"], "kind": row["kind"], "state": row["state"], "epoch": int(row["epoch"]),
        "model": row["serving_model"], "dims": row["serving_dims"],
        "coverage": serving_coverage,
        "target": target,
        "previous": {"model": row["previous_model"], "dims": row["previous_dims"]} if row["previous_model"] else None,
        "started_at": row["started_at"].isoformat() if row["started_at"] else None,
        "switched_at": row["switched_at"].isoformat() if row["switched_at"] else None,
        # a rolling restart's disagreement, not acted on before MEMEFLOW_SEARCH_CONFIG_GRACE_S (store/serving_attention.py)
        "pending_change": ({**row["config_disagree_ref"], "since": row["config_disagree_since"].isoformat()}
                           if row["config_disagree_since"] else None),
    }


def describe_live_txn(conn: Connection, row: Any) -> dict[str, Any]:
    """:func:`describe` with the live coverage of the serving and target models."""
    kind = row["kind"]
    serving_cov = coverage_txn(conn, row["scope_id"], kind, slot(row, "serving"))
    target = slot(row, "target")
    target_cov = coverage_txn(conn, row["scope_id"], kind, target) if target else None
    return describe(row, serving_coverage=serving_cov, target_coverage=target_cov)


def status(orch: Orchestrator, scope_id: str, kind: str = TEXT) -> dict[str, Any]:
    """One scope's serving state of ``kind`` with live coverage and its recent switches."""
    kind = check_kind(kind)
    with orch.engine.connect() as conn:
        row = q.serving_txn(conn, scope_id, kind)
        if row is None:
            ref = configured_ref(orch, kind)
            cov = coverage_txn(conn, scope_id, kind, ref)
            return {"scope_id": scope_id, "kind": kind, "state": "unset", "epoch": 0, "model": ref["model"],
                    "dims": ref["dims"], "coverage": cov, "target": None, "previous": None, "started_at": None,
                    "switched_at": None, "pending_change": None, "events": []}
        doc = describe_live_txn(conn, row)
        events = q.events_txn(conn, scope_id, kind, 10)
    doc["events"] = [{"action": e["action"], "epoch": int(e["epoch"]), "from_model": e["from_model"],
                      "to_model": e["to_model"], "at": e["at"].isoformat()} for e in events]
    return doc


def overview(orch: Orchestrator, scope_id: str | None = None) -> list[dict[str, Any]]:
    """Every scope's serving rows (stored coverage of the target, as of the last check)."""
    with orch.engine.connect() as conn:
        rows = q.all_serving_txn(conn, scope_id)
    return [describe(r) for r in rows]
