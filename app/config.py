"""Typed settings, read once from ``MEMEFLOW_*`` environment variables.

Every interval is configurable (fractional seconds allowed) so that tests run in milliseconds
without sleeping, and every process — API, workers, beat, CLI — reads the same variables.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

__all__ = ["Settings", "get_settings", "reset_settings"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A MEMEFLOW_* variable has a value that cannot be used."""


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name} must be a boolean (1/0/true/false), got {raw!r}")


#: Agents that run on the worker's CPU: limited by cores, not by a slot count guarding a provider.
LOCAL_AGENTS = frozenset({"local-ocr"})
REMOTE_AGENT_LANE_LIMIT = 4
#: A local agent keeps a DB-wide limit (fairness across scopes needs one) that the workers' cores
#: reach first: each worker runs at most one call per core.
LOCAL_AGENT_LANE_LIMIT = 64
#: With a local agent, one embedding-lane thread per this many cores: the text models are about a
#: fifth of an image's CPU beside local-ocr (docs/performance-log.md §41); without one, every other.
CORES_PER_EMBEDDING_THREAD_LOCAL_AGENT = 4
CORES_PER_EMBEDDING_THREAD = 2
#: The agent result records' directory inside the storage root (not a storage namespace).
AGENT_RESULTS_DIR = ".agent-results"
#: How long a worker's warm shutdown waits for its queued agent completions to commit (s).
COMPLETION_DRAIN_S = 30.0
#: The openai-compatible agent's connect timeout (s): with no deadline set, a call's bound is the
#: read timeout plus this (app/stages/agent/openai_compatible.py).
AGENT_CONNECT_TIMEOUT_S = 5.0
#: The exit status of a worker process the watchdog ended (a provider call past its run_max_s;
#: app/worker/watchdog.py): GNU ``timeout``'s.
STAGE_TIMEOUT_EXIT = 124
#: How much longer than its own deadline the watchdog lets an openai-compatible call run (s).
RUN_MAX_GRACE_S = 30.0
#: The longest backoff a retry's delayed hint may wait (``Settings.delayed_hint_max_s``): half the
#: Redis transport's ``visibility_timeout`` (celeryconfig). A worker holds an eta message
#: unacknowledged until it has run it, and Redis delivers a message again once it has been
#: unacknowledged for longer than that timeout; this leaves the other half for the run.
DELAYED_HINT_MAX_BOUND_S = 1800.0
#: Settings.agent_async_completion's values.
AGENT_ASYNC_COMPLETION = ("off", "local", "on")


@dataclass(frozen=True)
class Settings:
    """All runtime configuration. Field ``foo_bar`` is read from ``MEMEFLOW_FOO_BAR``."""

    database_url: str | None = None
    broker_url: str | None = None
    var_dir: Path = Path("./var")
    storage_dir: Path | None = None
    # Local agents' durable result records; unset: ``<storage>/.agent-results``, which every worker
    # sharing MEMEFLOW_STORAGE_DIR sees (a worker on another machine adopts a dead one's result).
    agent_results_dir: Path | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 5000
    flower_port: int = 5555
    flower_basic_auth: str | None = dataclasses.field(default=None, repr=False)  # secrets stay out of logs
    metrics_port: int = 0  # workers: serve Prometheus metrics on this port (0 = off)
    metrics_host: str = "0.0.0.0"
    metrics_token: str | None = None  # API /metrics: require `Authorization: Bearer <token>` when set
    auth: str = "none"
    session_ttl_s: float = 12 * 3600.0  # a browser sign-in (token mode) lasts this long at most
    trusted_proxy_hops: int = 0  # reverse proxies whose X-Forwarded-Proto/For are believed (HSTS, Secure cookies)
    # MEMEFLOW_AUTH=none on a non-loopback address needs this explicit opt-in (app.netguard).
    allow_unauthenticated_remote: bool = False
    # Host-header allow-list, comma separated ("*" = any); unset: localhost, 127.0.0.1, ::1, api_host.
    allowed_hosts: str | None = None
    # HMAC key of keyset cursors; unset: a random key generated once and kept in app_secrets.
    cursor_secret: str | None = dataclasses.field(default=None, repr=False)
    # ... or a file holding it (a Docker/Kubernetes secret mount); MEMEFLOW_CURSOR_SECRET wins.
    cursor_secret_file: str | None = None
    max_upload_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    lease_s: float = 60.0
    heartbeat_s: float = 20.0
    sweep_interval_s: float = 15.0
    worker_registry_interval_s: float = 10.0  # a worker's liveness upsert period; live = seen within 3x
    rehint_grace_s: float = 30.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    # a retry whose backoff ends within this many seconds publishes a hint due at that moment (a
    # Celery eta), so it runs when it becomes due rather than at the next sweep; a longer wait (a
    # provider's Retry-After) is left to the sweep, a sweep interval late at most; 0 = off.
    # At most DELAYED_HINT_MAX_BOUND_S.
    delayed_hint_max_s: float = 600.0
    max_attempts: int = 5
    # The longest one provider call of each lane may run before its worker process is ended
    # (app/worker/watchdog.py: a call that never returns holds its task and its worker for ever
    # otherwise); 0 = no limit. Sized far above the slowest real call on a small box
    # (docs/operations.md "A provider call that never returns").
    visual_run_max_s: float = 600.0
    agent_run_max_s: float = 900.0
    embedding_run_max_s: float = 600.0
    # DB-wide concurrent agent tasks; unset: 4 for a remote (paid) agent, LOCAL_AGENT_LANE_LIMIT for
    # a local CPU-bound one (each worker is then bounded by its cores, see agent_batch); 0 = unlimited.
    agent_lane_limit: int | None = None
    agent_resource_limit: int = 0
    embedding_batch_size: int = 32
    visual_batch_size: int = 32
    visual_batch_max_pixels: int = 64_000_000  # decoded pixels one visual batch may hold (≈ 192 MB as RGB)
    embedding_batch_max_chars: int = 400_000  # characters one text-embedding batch may render
    # a batched lane's worker that finished a batch less than this long ago waits out the rest
    # before it claims the next one, so the tasks that become due meanwhile (the agent's
    # completions, uploads) join one batch: no wait when the lane was idle (docs/performance-log.md §27)
    embedding_batch_linger_ms: float = 500.0
    visual_batch_linger_ms: float = 200.0
    # agent tasks one hint claims and runs at once; 0 = auto: 1 for a local CPU-bound agent
    # (local-ocr: its worker runs one call per core in threads instead), 2 otherwise
    agent_batch_size: int = 0
    # an agent call's thread hands its finished result (record written) to the worker's completion
    # thread and goes on to the next call, instead of committing it first (docs/performance-log.md §39):
    # off | local (only a local CPU-bound agent, e.g. local-ocr) | on (every agent)
    agent_async_completion: str = "off"
    # intra-op threads of each local model call (OCR, torch); concurrency comes from running
    # several calls at once (docs/performance-log.md §7); 0 = the libraries' defaults (one per core)
    local_threads: int = 1
    # the end of a burst (docs/performance-log.md §35), default off until measured on a quiet box: a
    # batch of a lane fed by earlier lanes (embedding) may keep this many cores busy while no
    # earlier lane's task is queued or running (a concatenated text provider then computes its
    # parts at once, one thread each: same vectors), and its linger waits only while an earlier
    # lane's task is queued; 0 = the cores the worker may use, 1 = off (one core; the linger
    # waits while an earlier lane's task is queued or running)
    local_burst_cores: int = 1
    # threads of a dedicated embedding-lane worker, each running its own batches (one core each);
    # 0 = sized from the cores it may use (``embedding_threads``): 1 on a small box, so a 2-core
    # box keeps the solo worker; more on a bigger one, where one core would cap the whole pipeline
    embedding_worker_threads: int = 0
    worker_task_events: bool = False
    # hints a worker handles itself, one after another, per delivered message, when a completion
    # returns one for a lane it consumes (instead of publishing it and taking it back from the
    # broker); 0 = publish every hint (docs/performance-log.md §23)
    worker_local_hints: int = 8
    sweep_batch_limit: int = 500
    sweep_lookback_s: float = 3600.0
    # The sweep ANALYZEs a hot table (store/sweep.py HOT_TABLES) once it has changed more rows since
    # its last analysis than it held then, and at least this many: a burst into an empty database
    # otherwise runs on plans cached while the tables were tiny until autovacuum's first analysis,
    # and each upload's statements cost more with every queued job (docs/performance-log.md §45);
    # 0 = leave statistics to autovacuum alone
    sweep_analyze_min_changes: int = 1000
    # Retention (app/orchestrator/retention.py): each sweep deletes history older than these ages
    # (seconds; 0 = keep forever) in steps that read retention_scan_rows rows and delete at most
    # retention_batch_size, retention_max_batches steps per kind per sweep (docs/operations.md).
    retention_tasks_s: float = 7 * 86400.0  # finished tasks no job stage points at any more
    retention_attempts_s: float = 7 * 86400.0  # completed/failed attempts of finished tasks
    retention_jobs_s: float = 30 * 86400.0  # ended jobs a newer job of the same image replaced
    retention_embeddings_s: float = 86400.0  # embeddings of an image version that is no longer current
    retention_old_models_s: float = 0.0  # embeddings of models no longer configured (0: kept; see docs)
    retention_ops_counters_s: float = 7 * 86400.0  # per-minute ops_counters buckets
    retention_grants_s: float = 30 * 86400.0  # ended operation grants (at least a day: the quota's window)
    retention_batch_size: int = 1000
    retention_max_batches: int = 2
    retention_scan_rows: int = 5000
    # wall-clock budget of a sweep's retention (ms; 0 = none): no step starts past it, and the kinds
    # take turns, least recently walked first, so a sweep's time stays flat as history grows
    retention_budget_ms: float = 150.0
    batch_page_size: int = 500
    batch_backlog_threshold: int = 2000
    # pages (of batch_page_size) one sweep seeds over all scopes' batches, round-robin; the rest next sweep
    batch_sweep_pages: int = 8
    # model changes (docs/operations.md): a scope in backfill checks whether the new model covers every
    # image at most this often (one whole-scope scan); a fill that leaves gaps is seeded again this many times
    search_cutover_check_s: float = 5.0
    search_fill_rounds: int = 3
    search_rollback_window_s: float = 7 * 24 * 3600.0  # a replaced model's rows stay (for a rollback) this long
    # a sweep acts on a configured model that differs from a scope's (begins a backfill, aborts or
    # retargets one) only once sweeps have disagreed so, with no sweep agreeing, for this long: during
    # a rolling restart old- and new-configuration workers both take sweeps, and would undo each
    # other (docs/operations.md). Many sweep intervals: which worker takes a sweep is chance.
    search_config_grace_s: float = 300.0
    # per-scope HNSW indexes (app/orchestrator/scope_indexes.py): beat runs the maintenance this often
    # (0 = never; ``memeflow search-indexes`` runs it once) for scopes above this many images
    # (unset: the exact-scan size, app.search.queries.EXACT_SCAN_MAX_IMAGES)
    search_index_interval_s: float = 300.0
    search_index_min_images: int | None = None
    search_index_maintenance_work_mem: str | None = None  # for the builds, e.g. 1GB (unset: the server's)
    # tenant limits (0 = unlimited); per-scope overrides: ``memeflow scopes limits``
    scope_max_bytes: int = 0
    scope_max_images: int = 0
    uploads_per_minute: int = 0
    processing_per_minute: int = 0
    visual_provider: str = "perceptual-v1"
    agent_provider: str = "local-ocr"
    text_provider: str = "multilingual-e5-small+all-MiniLM-L6-v2+multilingual-e5-small-querybank"
    text_document_version: str = "5"
    agent_base_url: str = "http://127.0.0.1:11434/v1"
    agent_model: str = "gpt-4o-mini"
    agent_api_key: str | None = dataclasses.field(default=None, repr=False)
    agent_timeout_s: float = 60.0
    agent_deadline_s: float = 120.0  # openai-compatible: the whole call (connect, headers, body), not per read
    agent_max_tokens: int = 2048  # openai-compatible: max_tokens sent with every request
    agent_max_response_bytes: int = 2 * 1024 * 1024  # openai-compatible: a longer (decoded) answer is cut and fails
    agent_lookup_url: str | None = None
    open_clip_checkpoint: str | None = None
    open_clip_model: str = "ViT-B-32"
    operation_policy: str = "allow-all"
    agent_daily_quota: int = 1000
    # events (issue 20): the outbox's live streams and webhook deliveries
    event_streams_per_scope: int = 4  # concurrent long-polls (wait > 0) and SSE streams per scope
    event_streams_per_process: int = 8  # the same, per API process (each holds a gunicorn thread), fairly shared
    # concurrent searches (text and look-alike) of one scope per API process: a tenant's searches
    # hold at most this many of a process's threads (gunicorn: 16); over it, 429 too_many_searches
    searches_per_scope: int = 4
    # and of every scope together, fairly shared (app/api/shares.py): with the streams per process
    # they must leave threads for every other request (gunicorn refuses to start otherwise)
    searches_per_process: int = 6
    event_poll_s: float = 0.1  # a waiting stream looks for new events this often
    event_heartbeat_s: float = 15.0  # SSE comment line while idle (also detects a gone client)
    event_stream_max_s: float = 300.0  # an SSE response ends after this; EventSource reconnects
    event_auth_check_s: float = 5.0  # a waiting stream asks again whether its token/session is still valid
    event_max_wait_s: float = 30.0  # the largest ``wait`` a long-poll may ask for
    events_retention_s: float = 7 * 86400.0  # the sweep prunes older events
    webhook_timeout_s: float = 5.0  # one delivery, connect to last byte read
    webhook_max_response_bytes: int = 64 * 1024  # of a receiver's answer, read and dropped
    webhook_max_attempts: int = 8  # per event and subscription; then the event is recorded failed
    webhook_backoff_base_s: float = 1.0
    webhook_backoff_max_s: float = 300.0
    webhook_lease_s: float = 30.0
    webhook_poll_s: float = 0.2  # a webhooks worker looks for subscriptions with new events this often
    webhook_events_per_claim: int = 50  # then a claim hands over (docs/events.md "Sharing the lane")
    webhook_claim_budget_s: float = 10.0  # a claim starts no delivery after this long: it hands over
    webhook_fair_check_s: float = 0.2  # a claim looks this often whether a less-served scope waits
    webhooks_per_scope: int = 20
    # CIDRs a webhook URL may resolve to besides public addresses (e.g. "127.0.0.0/8" for a local
    # receiver); unset: loopback, private, link-local and other non-global addresses are refused.
    webhook_allowed_networks: str | None = None
    log_json: bool = True
    log_level: str = "INFO"

    @cached_property  # resolved once per Settings (a worker joins it to every stored file it reads)
    def storage_path(self) -> Path:
        return Path(self.storage_dir or Path(self.var_dir) / "storage").resolve()

    @cached_property
    def agent_results_path(self) -> Path:
        """Where local agents keep their result records: shared by every worker, like the images
        (a record under one machine's var dir could not be adopted by another machine's worker)."""
        return Path(self.agent_results_dir or self.storage_path / AGENT_RESULTS_DIR).resolve()

    @cached_property
    def legacy_agent_results_path(self) -> Path:
        """Where versions before the shared location kept the records (``<var>/agent-results``):
        still read by lookups and pruned by ``memeflow gc``, never written."""
        return (Path(self.var_dir) / "agent-results").resolve()

    @property
    def agent_call_max_s(self) -> float:
        """The longest one agent call may legitimately run: the whole-call deadline
        (``agent_deadline_s``; 0 = the read timeout plus the connect timeout, the provider's rule),
        never less than one read's timeout. A warm shutdown must wait at least this long."""
        return max(self.agent_timeout_s, self.agent_deadline_s or self.agent_timeout_s + AGENT_CONNECT_TIMEOUT_S)

    def run_max_s(self, lane: str) -> float:
        """The longest one provider call of ``lane`` may run before the watchdog ends its worker
        (``<lane>_run_max_s``; 0 = no limit). The openai-compatible agent bounds its own calls
        (``agent_call_max_s``, ending them ``agent_deadline_exceeded``): the watchdog is its backstop
        only, never cutting a call its own deadline still allows."""
        limit = float(getattr(self, f"{lane}_run_max_s", 0.0) or 0.0)
        if limit > 0 and lane == "agent" and self.agent_provider == "openai-compatible":
            limit = max(limit, self.agent_call_max_s + RUN_MAX_GRACE_S)
        return limit

    @property
    def agent_is_local(self) -> bool:
        """The agent is a CPU-bound model in the worker (not a paid remote call)."""
        return self.agent_provider in LOCAL_AGENTS

    @property
    def agent_slots(self) -> int:
        """The agent lane's DB-wide limit in force (0 = unlimited); see ``agent_lane_limit``."""
        if self.agent_lane_limit is not None:
            return self.agent_lane_limit
        return LOCAL_AGENT_LANE_LIMIT if self.agent_is_local else REMOTE_AGENT_LANE_LIMIT

    @property
    def agent_batch(self) -> int:
        """Agent tasks one hint claims and runs concurrently (before the lane limit caps it)."""
        if self.agent_batch_size > 0:
            return self.agent_batch_size
        # A local agent's worker runs one hint per core in threads (app.cli.processes.lane_pool):
        # a batch would make a core wait for its batch-mate's slower image.
        return 1 if self.agent_is_local else 2

    def embedding_threads(self, cores: int) -> int:
        """Threads of a dedicated embedding-lane worker on ``cores`` cores: the setting, or one per
        ``CORES_PER_EMBEDDING_THREAD[_LOCAL_AGENT]`` cores (at least one). The lane batches, so
        one thread keeps up on a small box; on a big one the agent lane's threads (one per core)
        would outrun a single text thread, capping every image at that one core's rate."""
        if self.embedding_worker_threads > 0:
            return self.embedding_worker_threads
        per = CORES_PER_EMBEDDING_THREAD_LOCAL_AGENT if self.agent_is_local else CORES_PER_EMBEDDING_THREAD
        return max(1, int(cores) // per)

    @property
    def agent_completes_async(self) -> bool:
        """Whether agent results are committed by the worker's completion thread
        (``agent_async_completion``: ``on``, or ``local`` with a local CPU-bound agent)."""
        mode = self.agent_async_completion
        return mode == "on" or (mode == "local" and self.agent_is_local)

    @property
    def uses_embedded_services(self) -> bool:
        return self.database_url is None or self.broker_url is None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from ``env`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            name = f"MEMEFLOW_{f.name.upper()}"
            if name not in env:
                continue
            raw = env[name]
            values[f.name] = _convert(name, f, raw)
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.auth not in ("none", "token"):
            raise SettingsError(f"MEMEFLOW_AUTH must be 'none' or 'token', got {self.auth!r}")
        if self.lease_s <= 0 or self.heartbeat_s <= 0 or self.heartbeat_s >= self.lease_s:
            raise SettingsError("need 0 < MEMEFLOW_HEARTBEAT_S < MEMEFLOW_LEASE_S")
        if self.max_attempts < 1:
            raise SettingsError("MEMEFLOW_MAX_ATTEMPTS must be >= 1")
        # values that would crash, stall or spin a process long after it started
        if self.visual_batch_size < 1 or self.embedding_batch_size < 1:
            raise SettingsError("MEMEFLOW_VISUAL_BATCH_SIZE and MEMEFLOW_EMBEDDING_BATCH_SIZE must be >= 1")
        if self.sweep_interval_s <= 0 or self.worker_registry_interval_s <= 0:
            # 0: beat sends a sweep every loop tick, the registry thread upserts in a busy loop
            raise SettingsError("MEMEFLOW_SWEEP_INTERVAL_S and MEMEFLOW_WORKER_REGISTRY_INTERVAL_S must be > 0")
        if self.sweep_batch_limit < 1:
            raise SettingsError("MEMEFLOW_SWEEP_BATCH_LIMIT must be >= 1 (0: no sweep step would ever repair anything)")
        if min(self.rehint_grace_s, self.backoff_base_s, self.backoff_max_s) < 0:
            raise SettingsError("MEMEFLOW_REHINT_GRACE_S, MEMEFLOW_BACKOFF_BASE_S and MEMEFLOW_BACKOFF_MAX_S must be >= 0")
        if not 0 <= self.delayed_hint_max_s <= DELAYED_HINT_MAX_BOUND_S:
            raise SettingsError(f"MEMEFLOW_DELAYED_HINT_MAX_S must be within 0..{DELAYED_HINT_MAX_BOUND_S:g} "
                                "(half the broker's visibility timeout; 0 = off)")
        if self.max_upload_bytes < 1 or self.max_image_pixels < 1:
            raise SettingsError("MEMEFLOW_MAX_UPLOAD_BYTES and MEMEFLOW_MAX_IMAGE_PIXELS must be >= 1")
        if min(self.visual_run_max_s, self.agent_run_max_s, self.embedding_run_max_s) < 0:
            raise SettingsError("MEMEFLOW_VISUAL_RUN_MAX_S, MEMEFLOW_AGENT_RUN_MAX_S and MEMEFLOW_EMBEDDING_RUN_MAX_S "
                                "must be >= 0 (0 = no limit)")
        if self.agent_timeout_s <= 0 or self.agent_deadline_s < 0:
            raise SettingsError("need MEMEFLOW_AGENT_TIMEOUT_S > 0 and MEMEFLOW_AGENT_DEADLINE_S >= 0 "
                                "(0: the timeout plus the connect timeout)")
        if (self.agent_lane_limit or 0) < 0 or self.agent_resource_limit < 0 or self.agent_batch_size < 0:
            raise SettingsError("lane limits and the agent batch must be >= 0 (0 = unlimited / auto)")
        if self.embedding_batch_linger_ms < 0 or self.visual_batch_linger_ms < 0:
            raise SettingsError("MEMEFLOW_EMBEDDING_BATCH_LINGER_MS and MEMEFLOW_VISUAL_BATCH_LINGER_MS must be >= 0")
        if self.agent_async_completion not in AGENT_ASYNC_COMPLETION:
            raise SettingsError("MEMEFLOW_AGENT_ASYNC_COMPLETION must be 'off', 'local' or 'on', "
                                f"got {self.agent_async_completion!r}")
        if self.agent_async_completion == "on" and self.agent_provider == "openai-compatible" and not self.agent_lookup_url:
            # A killed worker may hold several finished, paid results not yet committed; without a
            # lookup the recovery cannot adopt them (unknown_execution), and a human retry pays again.
            raise SettingsError("MEMEFLOW_AGENT_ASYNC_COMPLETION=on with the openai-compatible agent needs "
                                "MEMEFLOW_AGENT_LOOKUP_URL (a killed worker's paid results could not be adopted); "
                                "use 'off' or set the lookup URL")
        if self.worker_local_hints < 0:
            raise SettingsError("MEMEFLOW_WORKER_LOCAL_HINTS must be >= 0 (0 = publish every hint)")
        if self.local_threads < 0:
            raise SettingsError("MEMEFLOW_LOCAL_THREADS must be >= 0 (0 = the libraries' defaults)")
        if self.local_burst_cores < 0:
            raise SettingsError("MEMEFLOW_LOCAL_BURST_CORES must be >= 0 (0 = the cores the worker may use)")
        if self.embedding_worker_threads < 0:
            raise SettingsError("MEMEFLOW_EMBEDDING_WORKER_THREADS must be >= 0 (0 = sized from the cores)")
        if self.session_ttl_s <= 0 or self.trusted_proxy_hops < 0:
            raise SettingsError("need MEMEFLOW_SESSION_TTL_S > 0 and MEMEFLOW_TRUSTED_PROXY_HOPS >= 0")
        if self.cursor_secret is not None and len(self.cursor_secret) < 16:
            raise SettingsError("MEMEFLOW_CURSOR_SECRET must be at least 16 characters (unset: a generated key)")
        if self.visual_batch_max_pixels < 1 or self.embedding_batch_max_chars < 1:
            raise SettingsError("MEMEFLOW_VISUAL_BATCH_MAX_PIXELS and MEMEFLOW_EMBEDDING_BATCH_MAX_CHARS must be >= 1")
        if min(self.scope_max_bytes, self.scope_max_images, self.uploads_per_minute, self.processing_per_minute) < 0:
            raise SettingsError("tenant limits must be >= 0 (0 = unlimited)")
        if min(self.retention_tasks_s, self.retention_attempts_s, self.retention_jobs_s, self.retention_embeddings_s,
               self.retention_old_models_s, self.retention_ops_counters_s, self.retention_grants_s) < 0:
            raise SettingsError("MEMEFLOW_RETENTION_*_S must be >= 0 (0 = keep forever)")
        if min(self.retention_batch_size, self.retention_max_batches, self.retention_scan_rows) < 1:
            raise SettingsError("MEMEFLOW_RETENTION_BATCH_SIZE, _MAX_BATCHES and _SCAN_ROWS must be >= 1")
        if self.batch_page_size < 1 or self.batch_sweep_pages < 1 or self.batch_backlog_threshold < 0:
            raise SettingsError("MEMEFLOW_BATCH_PAGE_SIZE and MEMEFLOW_BATCH_SWEEP_PAGES must be >= 1, "
                                "MEMEFLOW_BATCH_BACKLOG_THRESHOLD >= 0")
        if self.retention_budget_ms < 0:
            raise SettingsError("MEMEFLOW_RETENTION_BUDGET_MS must be >= 0 (0 = no budget)")
        if self.search_config_grace_s < 0:
            raise SettingsError("MEMEFLOW_SEARCH_CONFIG_GRACE_S must be >= 0 (0 = act on the first sweep)")
        if self.search_index_interval_s < 0 or (self.search_index_min_images or 0) < 0:
            raise SettingsError("MEMEFLOW_SEARCH_INDEX_INTERVAL_S and _MIN_IMAGES must be >= 0")
        if self.operation_policy not in ("allow-all", "quota"):
            raise SettingsError("MEMEFLOW_OPERATION_POLICY must be 'allow-all' or 'quota'")
        if min(self.event_streams_per_scope, self.event_streams_per_process, self.webhook_max_attempts,
               self.webhook_events_per_claim, self.searches_per_scope, self.searches_per_process) < 1:
            raise SettingsError("event stream limits, MEMEFLOW_SEARCHES_PER_SCOPE/_PER_PROCESS, MEMEFLOW_WEBHOOK_MAX_ATTEMPTS and "
                                "MEMEFLOW_WEBHOOK_EVENTS_PER_CLAIM must be >= 1")
        if min(self.event_poll_s, self.event_heartbeat_s, self.event_auth_check_s, self.webhook_timeout_s, self.webhook_lease_s,
               self.webhook_poll_s, self.webhook_claim_budget_s, self.webhook_fair_check_s) <= 0:
            raise SettingsError("event and webhook intervals must be > 0")
        if self.webhook_lease_s <= 2 * self.webhook_timeout_s:
            # a delivery outliving its claim's lease could be overtaken by the next claim's
            raise SettingsError("MEMEFLOW_WEBHOOK_LEASE_S must exceed twice MEMEFLOW_WEBHOOK_TIMEOUT_S")

    def replace(self, **changes: object) -> Settings:
        new = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        new.validate()
        return new


def _convert(name: str, f: dataclasses.Field, raw: str) -> object:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if raw == "" and "None" in kind:  # set but empty (compose's `${X:-}`): the default in force
        return None
    try:
        if kind.startswith("bool"):
            return _bool(name, raw)
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            value = float(raw)
            if not math.isfinite(value):
                # nan compares false with every bound (it passed 0 < heartbeat < lease) and
                # timedelta(seconds=nan or inf) raises in every claim
                raise ValueError(f"must be a finite number, got {raw!r}")
            return value
        if kind.startswith("Path"):
            return Path(raw) if raw else None
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None
    return raw or None if "None" in kind else raw


_settings: Settings | None = None


def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def reset_settings(settings: Settings | None = None) -> None:
    """Replace (or forget) the cached settings; for tests and the CLI."""
    global _settings
    _settings = settings


