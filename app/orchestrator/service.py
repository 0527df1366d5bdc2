"""The Orchestrator: the one object the API, workers and CLI call to read or change state.

It holds the engine, settings, clock and policy, and delegates each operation to the module that
owns it (changes, execution, advance, sweep). It is a facade for the API, the workers and the
CLI only: the orchestrator's own modules call each other directly (``execution`` →
``lanes``/``grants``/``advance``), never back through this class.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection, RowMapping

from app.config import Settings
from app.db.engine import read_connection
from app.ids import parse_uuid
from app.orchestrator import batches, changes, events, execution, lanes, limits, replan, serving, serving_reads, webhooks
from app.orchestrator import sweep as sweep_mod
from app.orchestrator.clock import DatabaseClock
from app.orchestrator.errors import NotFound
from app.orchestrator.hints import Hint
from app.orchestrator.lane_limits import LaneLimitCache
from app.orchestrator.policy import OperationPolicy, policy_from_settings
from app.orchestrator.stages import by_lane, earlier_lanes
from app.orchestrator.store import reads
from app.orchestrator.types import BatchClaim, Claim, StageConfigs, SweepReport
from app.stages.errors import ProviderConfigMismatch

log = logging.getLogger(__name__)
_INDEXED: set[tuple[str, str, str, int]] = set()  # (database, table, model, dims) seen by this process
# the same key: not asked again before this time.monotonic() (a build failed, or another process builds it)
_INDEX_RETRY_AT: dict[tuple[str, str, str, int], float] = {}
INDEX_RETRY_AFTER_FAILURE_S = 60.0
INDEX_RETRY_WHILE_BUILDING_S = 5.0


def utcnow() -> datetime:
    """This host's wall clock (an orchestrator's default is the database's: ``DatabaseClock``)."""
    return datetime.now(timezone.utc)


class Orchestrator:
    def __init__(
        self, engine: Engine, settings: Settings, *, clock: Callable[[], datetime] | None = None,
        policy: OperationPolicy | None = None, stage_configs: StageConfigs | None = None, rand: random.Random | None = None,
    ):
        self.engine = engine
        self.settings = settings
        # every time it writes or compares (leases, backoff, re-hints) is on the database's clock, so
        # processes on hosts with skewed clocks agree (app/orchestrator/clock.py); tests inject theirs
        self.now = clock or DatabaseClock(engine)
        self.policy: OperationPolicy = policy if policy is not None else policy_from_settings(settings)
        self.rand = rand or random.Random()
        self._stage_configs = stage_configs
        # the agent lane limits in force across the deployment, read from the registry once per interval
        self.lane_limits = LaneLimitCache()

    @functools.cached_property
    def _database_key(self) -> str:
        """The engine's URL rendered once (``_INDEXED`` is keyed by it for every stored vector)."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def stage_configs(self) -> StageConfigs:
        if self._stage_configs is None:
            self._stage_configs = StageConfigs.from_settings(self.settings)
        return self._stage_configs

    # ------------------------------------------------------------------ requests (API, CLI)
    def ensure_scope(self, scope_id: str) -> uuid.UUID:
        from app.orchestrator.store.images import ensure_scope_txn

        with self.engine.begin() as conn:
            return ensure_scope_txn(conn, scope_id)

    def scope_exists(self, scope_id: str) -> bool:
        """Whether the scope exists (an upload, an ingest or ``memeflow scopes create`` made it)."""
        from app.orchestrator.store.limits import scope_exists_txn

        with self.engine.connect() as conn:
            return scope_exists_txn(conn, scope_id)

    ingest_image = changes.ingest_image
    request_processing = changes.request_processing
    retry_job = changes.retry_job
    cancel_job = changes.cancel_job
    edit_context = changes.edit_context
    replace_content = changes.replace_content
    delete_image = changes.delete_image

    # ------------------------------------------------------------------ reads
    def get_image(self, scope_id: str, image_id: uuid.UUID | str) -> dict:
        with self.engine.connect() as conn:
            doc = reads.get_image_txn(conn, scope_id, _uuid(image_id))
        if doc is None:
            raise NotFound("image not found")
        return doc

    def list_images(self, scope_id: str, *, after=None, limit: int = 20) -> tuple[list[dict], Any]:
        with self.engine.connect() as conn:
            items = reads.list_images_txn(conn, scope_id, after, limit + 1)
        return _page(items, limit)

    def get_job(self, scope_id: str, job_id: uuid.UUID | str) -> dict:
        with self.engine.connect() as conn:
            doc = reads.get_job_txn(conn, scope_id, _uuid(job_id))
        if doc is None:
            raise NotFound("job not found")
        return doc

    def list_jobs(self, scope_id: str, *, status=None, image_id=None, after=None, limit: int = 20):
        with self.engine.connect() as conn:
            items = reads.list_jobs_txn(conn, scope_id, status=status, image_id=image_id, after=after,
                                        limit=limit + 1)
        return _page(items, limit)

    def get_task(self, scope_id: str, task_id: uuid.UUID | str) -> dict:
        with self.engine.connect() as conn:
            doc = reads.get_task_txn(conn, scope_id, _uuid(task_id))
        if doc is None:
            raise NotFound("task not found")
        return doc

    # ------------------------------------------------------------------ workers
    # The worker path's reads use read_connection (autocommit): a ROLLBACK would drop the
    # connection's prepared statements (app/db/engine.py).
    def claim_task(self, task_id: uuid.UUID | str, owner: str, lane: str | None = None,
                   hints_out: list[Hint] | None = None, *, recall_safe: bool = False, shared: bool = False
                   ) -> Claim | None:
        return execution.claim_task(self, _uuid(task_id), owner, lane, hints_out, recall_safe=recall_safe,
                                    shared=shared)

    def claim_batch(self, lane: str, n: int, owner: str) -> list[Claim]:
        return execution.claim_batch(self, lane, n, owner)

    def claim_with_batch(self, task_id: uuid.UUID | str, lane: str, n: int, owner: str,
                         shared: bool = False) -> BatchClaim:
        return execution.claim_with_batch(self, _uuid(task_id), lane, n, owner, shared)

    def run_alone(self, claim: Claim) -> bool:
        return execution.run_alone(self, claim)

    def claim_agent_batch(self, task_id: uuid.UUID | str, n: int, owner: str,
                          hints_out: list[Hint] | None = None, *, recall_safe: bool = False, shared: bool = False
                          ) -> list[Claim]:
        return execution.claim_agent_batch(self, _uuid(task_id), n, owner, hints_out, recall_safe=recall_safe,
                                           shared=shared)

    def restart_attempt(self, claim: Claim, recall_safe: bool) -> Claim | None:
        return execution.restart_attempt(self, claim, recall_safe)

    def earlier_lanes_active(self, lane: str) -> bool:
        """Whether a task of a lane before ``lane`` in the stage order is queued or running, i.e.
        whether a completion may still feed ``lane`` more work (its batch linger's question)."""
        earlier = earlier_lanes(lane)
        if not earlier:
            return False
        with read_connection(self.engine) as conn:
            return reads.lanes_active_txn(conn, list(earlier))

    def earlier_lanes_pending(self, lane: str) -> tuple[bool, bool]:
        """(whether a task of a lane before ``lane`` is queued, whether one is running): the
        linger's question, split (a burst's last tasks run while nothing is queued)."""
        earlier = earlier_lanes(lane)
        if not earlier:
            return False, False
        with read_connection(self.engine) as conn:
            return reads.lanes_pending_txn(conn, list(earlier))

    def heartbeat(self, claim: Claim) -> bool:
        return execution.heartbeat(self, claim)

    def note_overrun(self, claims: list[Claim], error: dict) -> None:
        execution.note_overrun(self, claims, error)

    def complete_task(self, claim: Claim, artifact: Any) -> list[Hint]:
        return self.complete_tasks([(claim, artifact)])

    def complete_tasks(self, results: list[tuple[Claim, Any]], landed: list[Claim] | None = None) -> list[Hint]:
        """Complete several claims of one lane in one transaction (each fenced on its own);
        ``landed`` receives the claims whose completion committed.

        A model's first vectors then build its per-model index — after the commit, never before:
        the worker's heartbeat has stopped by the time it completes, so a build (minutes on a big
        table) run first let the batch's leases lapse, another worker took the tasks, and this
        batch's results were fenced out when the build ended. Rows written before a CONCURRENTLY
        build are in it."""
        hints = execution.complete_tasks(self, results, landed)
        wanted: set[tuple[str, str, int]] = set()  # each index once per call, not once per claim
        for claim, artifact in results:
            spec = by_lane(claim.lane)
            if spec is not None and spec.vector_index:
                for vec in (artifact, *getattr(artifact, "extra", ())):
                    wanted.add((spec.artifact_table, vec.model, int(vec.dims)))
        for table, model, dims in sorted(wanted):
            self.ensure_vector_index(table, model, dims)
        spec = by_lane(results[0][0].lane) if results else None
        kind = spec.serving_kind if spec is not None else None
        if kind is not None:
            serving.after_completions(self, sorted({c.scope_id for c, _ in results}), kind, [c for c, _ in results])
        return hints

    def visual_extra_models(self, claims: list[Claim]) -> dict[uuid.UUID, list[dict]]:
        """The other visual models each claim's image needs for its scope's serving state (model refs)."""
        with read_connection(self.engine) as conn:
            return serving_reads.extra_models_txn(self, conn, claims, serving_reads.VISUAL)

    def text_inputs_many(self, claims: list[Claim]) -> dict[uuid.UUID, dict]:
        """What each claim's semantic document is rendered from, in one query, by image id (rows of
        another scope dropped; the worker re-checks the metadata hash at completion), with the
        ``extra_models`` its scope's search serving state also needs (model refs, app/orchestrator/serving_reads.py)."""
        scopes = {c.image_id: c.scope_id for c in claims}
        with read_connection(self.engine) as conn:
            rows = reads.text_inputs_many_txn(conn, list(scopes))
            extra = serving_reads.extra_models_txn(self, conn, claims, serving_reads.TEXT)
        return {iid: {**dict(r), "extra_models": extra.get(iid, [])}
                for iid, r in rows.items() if scopes.get(iid) == r["scope_id"]}

    def ensure_vector_index(self, table: str, model: str, dims: int) -> None:
        """Make sure the per-model HNSW index exists (or is being built) when a vector of a model
        lands: built CONCURRENTLY, so other writes go on (``ensure_vector_index_concurrently``).
        Never fails the completion that asks: search is exact without the index, and a build that
        failed (a lock timeout while it waited for older transactions) is tried again by the next."""
        key = (self._database_key, table, model, int(dims))
        if key in _INDEXED or time.monotonic() < _INDEX_RETRY_AT.get(key, 0.0):
            return
        from app.db.engine import ensure_vector_index_concurrently

        try:
            built = ensure_vector_index_concurrently(self.engine, table, model, int(dims))
        except Exception:  # noqa: BLE001 - the index is for speed; the vectors are what must land
            # e.g. a lock timeout behind a long transaction: this process asks again in a minute,
            # not at every completion (each attempt waits up to the lock timeout)
            _INDEX_RETRY_AT[key] = time.monotonic() + INDEX_RETRY_AFTER_FAILURE_S
            log.warning("per-model vector index build failed; this process tries again in %.0f s",
                        INDEX_RETRY_AFTER_FAILURE_S, exc_info=True, extra={"code": f"{table}:{model}:{int(dims)}"})
            return
        if built:
            _INDEXED.add(key)
            _INDEX_RETRY_AT.pop(key, None)
        else:  # another process builds it: look again in a while
            _INDEX_RETRY_AT[key] = time.monotonic() + INDEX_RETRY_WHILE_BUILDING_S

    def fail_task(self, claim: Claim, error) -> list[Hint]:
        """A stage error of a claim; a configuration mismatch replans the job instead (replan.py)."""
        if isinstance(error, ProviderConfigMismatch):
            hints = replan.replan_for_config(self, claim, error)
            if hints is not None:
                return hints
        return execution.fail_task(self, claim, error)

    def mark_unknown_execution(self, claim: Claim) -> list[Hint]:
        return execution.mark_unknown_execution(self, claim)

    def abandon_task(self, claim: Claim, reason: str = "cancelled") -> list[Hint]:
        return execution.abandon_task(self, claim, reason)

    def sweep(self) -> SweepReport:
        return sweep_mod.sweep(self)

    # ------------------------------------------------------------------ batches (SPEC §4.8)
    create_batch = batches.create_batch
    get_batch = batches.get_batch
    cancel_batch = batches.cancel_batch
    seed_batch = batches.seed_batch

    def open_attempt_ids(self, attempt_ids: list[str]) -> set[str]:
        """Those of ``attempt_ids`` still in flight (their agent result records are still needed)."""
        from app.orchestrator.store.attempts import open_attempt_ids_txn

        with read_connection(self.engine) as conn:
            return open_attempt_ids_txn(conn, attempt_ids)

    # ------------------------------------------------------------------ events (issue 20)
    read_events = events.read_events
    last_event_id = events.last_event_id
    stream_slot = events.stream_slot
    create_webhook = webhooks.create_webhook
    list_webhooks = webhooks.list_webhooks
    delete_webhook = webhooks.delete_webhook
    claim_webhook = webhooks.claim_webhook
    next_webhook_event = webhooks.next_webhook_event
    webhook_delivered = webhooks.webhook_delivered
    webhook_failed = webhooks.webhook_failed
    release_webhook = webhooks.release_webhook
    webhook_should_hand_over = webhooks.webhook_should_hand_over
    hand_over_webhook = webhooks.hand_over_webhook
    webhook_hints = webhooks.webhook_hints
    any_webhook = webhooks.any_webhook
    recent_webhook_failures = webhooks.recent_webhook_failures
    # ------------------------------------------------------------------ search serving (model changes)
    reconcile_serving = serving.reconcile
    try_cutover = serving.try_cutover
    search_cutover = serving.cutover_early
    search_rollback = serving.rollback
    search_resume = serving.resume
    search_serving_status = serving_reads.status
    search_serving_overview = serving_reads.overview

    # ------------------------------------------------------------------ tenant limits (issue 17)
    take_request = limits.take_request
    set_scope_limits = limits.set_scope_limits

    # ------------------------------------------------------------------ hooks
    def job_priority(self, job: RowMapping) -> int:
        """Interactive work (uploads, explicit requests) before library batches."""
        return 0 if job["batch_id"] else 1

    def release_orphan_slots_txn(self, conn: Connection) -> int:
        """The sweep's slot step (kept for ``orchestrator/sweep.py``, which calls it through the
        facade; it should call ``lanes.release_orphan_slots_txn`` directly)."""
        return lanes.release_orphan_slots_txn(self, conn)

    def continue_batches(self, errors: list[BaseException] | None = None) -> tuple[int, list[Hint]]:
        return batches.continue_batches(self, errors)


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    parsed = parse_uuid(value)
    if parsed is None:
        raise NotFound("not found")
    return parsed


def _page(items: list[dict], limit: int) -> tuple[list[dict], Any]:
    if len(items) > limit:
        items = items[:limit]
        last = items[-1]
        return items, (datetime.fromisoformat(last["created_at"]), uuid.UUID(last["id"]))
    return items, None
