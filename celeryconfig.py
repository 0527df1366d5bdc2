"""Celery configuration for memeflow: queues, routes, reliability flags and the sweep schedule.

Celery carries wake-up hints only. A message body is one ID string; PostgreSQL decides whether
there is anything to do. So: JSON only, no result backend, acks late with prefetch 1 (a killed
worker's message is redelivered, and the DB claim makes redelivery harmless), and short broker
timeouts on the publishing side so an upload never waits on a dead Redis.

Every interval comes from :class:`app.config.Settings` (``MEMEFLOW_*``), so tests run fast.

The ``maintenance`` queue (sweeps, batch seeding) is consumed by every worker, whatever ``-Q``
says (``app.worker.tasks`` adds it at start; ``memeflow worker --no-maintenance`` opts out), so a
deployment of lane workers and beat alone runs every sweep.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from app.config import get_settings
from app.db.enums import Lane
from app.worker.broker import broker_ssl_for, broker_transport_for, broker_url_for

_settings = get_settings()

#: The stage lanes (app/orchestrator/stages.py says which stage runs on which).
LANES = tuple(lane.value for lane in Lane)
MAINTENANCE = "maintenance"
#: Webhook deliveries (issue 20): the body is a subscription id; not a stage lane.
WEBHOOKS = "webhooks"
QUEUES = (*LANES, WEBHOOKS, MAINTENANCE)

#: One Celery task name per lane; the body is the task id and nothing else.
LANE_TASKS = {lane: f"memeflow.run_{lane}" for lane in LANES}
WEBHOOK_TASK = "memeflow.deliver_webhooks"
#: Every queue a hint may go to, with the task that wakes it.
HINT_TASKS = {**LANE_TASKS, WEBHOOKS: WEBHOOK_TASK}
SWEEP_TASK = "memeflow.reconcile_sweep"
SWEEP_EXPIRES_MIN_S = 10.0
SEED_BATCH_TASK = "memeflow.seed_batch"
#: Per-scope HNSW index maintenance (app/orchestrator/scope_indexes.py), its own beat entry and lock.
SEARCH_INDEXES_TASK = "memeflow.search_indexes"

broker_url = broker_url_for(_settings)
# kombu's Redis transport with one client object per pool for its publishes, acks and QoS updates
# (app/worker/broker.py: kombu built one per command); the same commands on the wire
broker_transport = broker_transport_for(broker_url)
# a rediss:// broker verifies the server's certificate unless its URL says otherwise
broker_use_ssl = broker_ssl_for(broker_url)
broker_connection_retry_on_startup = True
broker_connection_retry = True
broker_connection_max_retries = None  # a worker waits for its broker forever
broker_connection_timeout = 2.0
# Applies to every connection (workers and publishers). socket_connect_timeout keeps a publish
# against an unreachable host short; max_retries bounds kombu's reconnect loop when a producer
# opens its channel, so a hint publish fails fast and the sweep re-hints later.
broker_transport_options = {
    "socket_connect_timeout": 1.0,
    "socket_timeout": 5.0,
    "socket_keepalive": True,
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
    # a message unacknowledged this long is delivered again: a retry's delayed hint (an eta held by
    # the worker that received it) waits at most half of it (app.config.DELAYED_HINT_MAX_BOUND_S)
    "visibility_timeout": 3600,
}

task_serializer = "json"
accept_content = ["json"]
event_serializer = "json"
result_accept_content = ["json"]
result_backend = None
task_ignore_result = True
task_store_errors_even_if_ignored = False

task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
worker_hijack_root_logger = False
worker_redirect_stdouts = False
# Task events (received/started/succeeded: three Redis publishes per hint) only while someone
# watches: Flower broadcasts enable_events every few seconds while it runs, so its task views
# work; without Flower workers do not pay for them. MEMEFLOW_WORKER_TASK_EVENTS=true forces them.
worker_send_task_events = _settings.worker_task_events
task_send_sent_event = False
# Celery's consumer, whose buffered task events go out once per EVENTS_FLUSH_S (0.5 s) in one
# message instead of one message per event (app/worker/consumer.py)
worker_consumer = "app.worker.consumer:Consumer"
worker_cancel_long_running_tasks_on_connection_loss = False

task_default_queue = MAINTENANCE
task_queues = tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES)
task_routes = {
    **{name: {"queue": lane, "routing_key": lane} for lane, name in LANE_TASKS.items()},
    WEBHOOK_TASK: {"queue": WEBHOOKS, "routing_key": WEBHOOKS},
    SWEEP_TASK: {"queue": MAINTENANCE, "routing_key": MAINTENANCE},
    SEED_BATCH_TASK: {"queue": MAINTENANCE, "routing_key": MAINTENANCE},
    SEARCH_INDEXES_TASK: {"queue": MAINTENANCE, "routing_key": MAINTENANCE},
}

timezone = "UTC"
enable_utc = True
beat_schedule = {
    "reconcile-sweep": {
        "task": SWEEP_TASK,
        "schedule": float(_settings.sweep_interval_s),
        "args": (),
        # A sweep that waited longer than a few intervals is pointless: a newer one follows (an
        # expired message is discarded in ms, so a late or slow sweep never loses all of them). The
        # floor keeps short test intervals from expiring messages that a busy box merely delivers late.
        "options": {"queue": MAINTENANCE, "expires": max(3 * float(_settings.sweep_interval_s), SWEEP_EXPIRES_MIN_S)},
    },
}
if _settings.search_index_interval_s > 0:
    # Not a sweep step: a build takes minutes. The worker that takes it runs the pass in a thread.
    beat_schedule["search-indexes"] = {
        "task": SEARCH_INDEXES_TASK,
        "schedule": float(_settings.search_index_interval_s),
        "args": (),
        "options": {"queue": MAINTENANCE, "expires": max(float(_settings.search_index_interval_s), 1.0)},
    }
beat_max_loop_interval = max(min(float(_settings.sweep_interval_s), 5.0), 0.1)
