"""The execution loop body shared by Celery tasks and the test worker: claim → execute with a
heartbeat → complete or fail → publish the returned hints (after the orchestrator committed)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from app import metrics
from app.config import COMPLETION_DRAIN_S  # how long a warm shutdown waits for handed-over completions
from app.db.enums import Lane
from app.orchestrator.errors import UnstorableResult
from app.orchestrator.hints import Hint, HintPublisher
from app.orchestrator.lanes import lane_batch_size
from app.orchestrator.service import Orchestrator
from app.orchestrator.stages import by_lane, earlier_lanes
from app.orchestrator.types import Claim
from app.stages import cpu
from app.stages.agent import records
from app.stages.base import is_recall_safe
from app.stages.errors import PermanentError, StageError
from app.stages.providers import Providers
from app.worker import executor, watchdog

log = logging.getLogger(__name__)


class Heartbeat:
    """Extends the claims' leases every heartbeat_s while the block runs; ``stop_requested`` on
    rejection/cancel. One beater thread per process serves every open Heartbeat (``_Beater``):
    a task no longer starts and joins a thread of its own (most end long before their first beat)."""

    def __init__(self, orch: Orchestrator, claims: list[Claim]):
        self.orch = orch
        self.claims = claims
        self.stop_requested = threading.Event()
        self.due = 0.0  # time.monotonic() of the next beat (the beater's, under its lock)
        self.calls: dict[int, watchdog.Call] = {}  # provider calls in flight (the beater's, under its lock)
        self._beating = threading.Lock()  # held while a beat of these claims runs
        self._ended = False

    def __enter__(self) -> Heartbeat:
        _beater.add(self, time.monotonic() + self.orch.settings.heartbeat_s)
        return self

    def __exit__(self, *exc) -> None:
        _beater.remove(self)
        # a beat of these claims in flight ends first (at most 5 s, as the join of a beat thread
        # did): the caller's terminal write comes after it
        got = self._beating.acquire(timeout=5)
        self._ended = True
        if got:
            self._beating.release()

    def arm(self, call: watchdog.Call) -> None:
        """A provider call for these claims started: past its deadline, the watchdog ends the process."""
        _beater.arm(self, call)

    def disarm(self, call: watchdog.Call) -> None:
        _beater.disarm(self, call)

    def stop_beating(self) -> None:
        """No beat of these claims from now on (a provider call overran: their leases must lapse)."""
        _beater.remove(self)
        with self._beating:
            self._ended = True

    def beat(self) -> None:
        """One beat of every claim (in the beater thread); nothing once the block ended."""
        with self._beating:
            if self._ended:
                return
            for claim in self.claims:
                try:
                    if not self.orch.heartbeat(claim):
                        self.stop_requested.set()
                except Exception:  # a DB hiccup: the lease may lapse, the fencing keeps us safe
                    log.exception("heartbeat failed", extra={"task_id": claim.task_id})


class _Beater:
    """The process's heartbeat thread: beats each open Heartbeat when it is due, one after the
    other, and sleeps until the next is due (started on first use; a forked child starts its own).
    It is also the process's watchdog: a provider call armed on an open Heartbeat that is still in
    flight past its deadline ends the process (``watchdog.overrun``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open: set[Heartbeat] = set()
        self._wake_at = float("inf")  # when the thread's current wait ends
        self._thread: threading.Thread | None = None

    def add(self, hb: Heartbeat, due: float) -> None:
        with self._cond:
            hb.due = due
            self._open.add(hb)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            elif due < self._wake_at:  # due before the thread wakes: wake it (not the usual case)
                self._cond.notify()

    def remove(self, hb: Heartbeat) -> None:
        with self._cond:
            self._open.discard(hb)

    def arm(self, hb: Heartbeat, call: watchdog.Call) -> None:
        with self._cond:
            hb.calls[call.id] = call
            if hb in self._open and call.deadline < self._wake_at:
                self._cond.notify()

    def disarm(self, hb: Heartbeat, call: watchdog.Call) -> None:
        with self._cond:
            hb.calls.pop(call.id, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                overdue = next(((hb, c) for hb in self._open for c in hb.calls.values() if c.deadline <= now), None)
                due = [hb for hb in self._open if hb.due <= now]
                for hb in due:
                    hb.due = now + hb.orch.settings.heartbeat_s
                if overdue is None and not due:
                    self._wake_at = min((t for hb in self._open for t in (hb.due, *(c.deadline for c in hb.calls.values()))),
                                        default=float("inf"))
                    self._cond.wait(None if self._wake_at == float("inf") else self._wake_at - now)
                    self._wake_at = float("-inf")  # awake: an add needs no notify
                    continue
            if overdue is not None:  # before any beat: an overrun claim's lease is never extended again
                watchdog.overrun(*overdue)
            for hb in due:
                hb.beat()


_beater = _Beater()


_CALL_THREADS = 64  # a bound, not a pool size: threads start only as concurrent calls need them
_call_pool: ThreadPoolExecutor | None = None
_call_pool_lock = threading.Lock()


def _calls() -> ThreadPoolExecutor:
    """The process's threads for an agent batch's concurrent calls, started once and reused
    (starting a thread per call cost more than a no-op call)."""
    global _call_pool
    with _call_pool_lock:
        if _call_pool is None:
            _call_pool = ThreadPoolExecutor(max_workers=_CALL_THREADS, thread_name_prefix="agent-call")
        return _call_pool


#: Agent completions handed to the completion thread that may wait before a call thread blocks.
COMPLETION_QUEUE = 4


class _Completer:
    """The process's completion thread (``Settings.agent_async_completion``): an agent call thread
    whose call finished — its result record written — hands the batch's terminal writes here and
    goes on to claim and compute the next call, instead of committing first.

    Each handed-over job runs the synchronous path's own terminal writes (``_finish_agent_batch``:
    the fenced ``complete_tasks``, failures, hints, record cleanup), one job at a time, in order.
    The claims' Heartbeat stays open until the job starts (their leases cannot lapse while they
    wait), and is closed before the writes, as the synchronous path does. The queue is bounded: a
    call thread that finds it full waits (back-pressure, nothing is dropped). A process killed
    with jobs waiting loses only their commits: their attempts are ``external_started`` with a
    durable record, which the lease recovery adopts (no second call). Started on first use; a
    forked child starts its own (the parent's jobs stay the parent's)."""

    def __init__(self, size: int = COMPLETION_QUEUE) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; blocks while the queue is full."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agent-completer", daemon=True)
                self._thread.start()
        self._queue.put(job)

    @property
    def pending(self) -> int:
        """Jobs handed over and not finished yet (waiting or running)."""
        return self._queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except Exception:  # noqa: BLE001 - as a failed synchronous completion: the lease recovery adopts it
                log.exception("an asynchronous agent completion failed")
            finally:
                self._queue.task_done()

    def drain(self, timeout: float = COMPLETION_DRAIN_S) -> bool:
        """Wait (at most ``timeout`` s) until every handed-over job finished; False if some had not."""
        q = self._queue
        deadline = time.monotonic() + timeout
        if q.unfinished_tasks:
            log.info("waiting up to %.0f s for %d queued agent completions to commit", timeout, q.unfinished_tasks)
        with q.all_tasks_done:
            while q.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("%d agent completions still queued at shutdown: the lease recovery "
                                "adopts their results", q.unfinished_tasks)
                    return False
                q.all_tasks_done.wait(left)
        return True


_completer = _Completer()


def drain_completions(timeout: float = COMPLETION_DRAIN_S) -> bool:
    """A warm shutdown's wait for this process's queued agent completions (celery's shutdown
    signals, and atexit)."""
    return _completer.drain(timeout)


atexit.register(drain_completions)


def _forget_call_pool() -> None:  # a forked child has none of its parent's threads
    global _call_pool, _call_pool_lock, _beater, _completer, _gate
    _call_pool, _call_pool_lock = None, threading.Lock()
    _beater = _Beater()
    _completer = _Completer()
    _gate = _ComputeGate()


os.register_at_fork(after_in_child=_forget_call_pool)


_internal_error = executor.as_stage_error  # an unexpected exception: retryable, never "provably not executed"


#: How many task threads this process runs side by side (a threads pool's concurrency, set at the
#: worker's start by app.worker.tasks); above 1, claims are never a run alone (``_ComputeGate``).
COMPUTE_THREADS = 1


class _ComputeGate:
    """Which of this process's task threads may compute, when it runs several (a threads pool).

    A claim of one task is a run alone in the store (``claimed_alone``: a death of its process is
    charged to it), but a threads pool runs other claims beside it, and an input of theirs may be
    what kills the process. So there every claim is made ``shared`` (never alone), computes
    holding the gate shared, and a task whose previous run died is run with the gate held
    exclusively — no other thread of the process computes meanwhile — marked alone first
    (``Orchestrator.run_alone``) and until its terminal write. A poisoned input thus dies alone
    and is charged for its own deaths only, and no task is charged for another thread's (SPEC §10).
    Waiting exclusive runs go first, so a stream of batches cannot hold one off."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


_gate = _ComputeGate()


def _computing() -> contextlib.AbstractContextManager:
    """The gate held shared while a claim computes, in a process of several task threads."""
    return _gate.shared() if COMPUTE_THREADS > 1 else contextlib.nullcontext()


def _compute(orch: Orchestrator, claim: Claim, providers: Providers) -> object | None:
    """The claim's artifact (None: an interrupted paid call whose outcome cannot be proven)."""
    if claim.lane == Lane.AGENT and claim.recovering:
        return executor.recover_agent(orch.settings, providers, claim)
    if claim.lane == Lane.AGENT:
        return executor.execute_agent(orch.settings, providers, claim)
    result = _compute_batch(orch, claim.lane, [claim], providers)[0]
    if isinstance(result, StageError):
        raise result
    return result


def _compute_batch(orch: Orchestrator, lane: str, claims: list[Claim], providers: Providers) -> list:
    """The lane's stage's batch compute (``executor.BATCH_COMPUTE`` by its provider kind)."""
    spec = by_lane(lane)
    compute = executor.BATCH_COMPUTE.get(spec.provider_kind) if spec is not None else None
    if compute is None:
        raise ValueError(f"the {lane} lane runs one claim at a time")
    return compute(orch, providers, claims)


def execute_claim(orch: Orchestrator, claim: Claim, providers: Providers, publisher: HintPublisher) -> str:
    """Run one claimed task to an outcome; returns 'succeeded' | 'failed' | 'unknown' | 'cancelled'
    ('dropped': a recovering claim fenced out before it ran again)."""
    with contextlib.ExitStack() as alone:
        with Heartbeat(orch, [claim]) as hb, watchdog.computing_for(hb):
            if _runs_again(claim):
                alone.enter_context(_exclusive())  # kept until the terminal write below
                claim, result = _recover(orch, claim, providers)
                if claim is None:
                    return "dropped"
            else:
                result = _outcome(orch, claim, providers)
        # The terminal write happens after the heartbeat stopped: a beat landing just after the
        # completion committed would match no running row and be counted as a fencing rejection.
        return _terminal(orch, claim, result, hb, publisher)


def _terminal(orch: Orchestrator, claim: Claim, result: object, hb: Heartbeat, publisher: HintPublisher) -> str:
    """``execute_claim``'s terminal write of ``result``; returns the outcome."""
    if isinstance(result, StageError):
        hints, outcome = orch.fail_task(claim, result), "failed"
    elif result is None:
        hints, outcome = orch.mark_unknown_execution(claim), "unknown"
    else:
        landed: list[Claim] = []
        try:
            hints = orch.complete_tasks([(claim, result)], landed)
        except UnstorableResult:  # a value the database refuses: its provider's bad output
            publisher.publish(complete_isolated(orch, [(claim, result)]))
            return "failed"
        outcome = "cancelled" if hb.stop_requested.is_set() else "succeeded"
        publisher.publish(hints)  # the next stage's hints first: the records' cleanup can wait
        _discard_records(orch, landed)
        return outcome
    publisher.publish(hints)
    return outcome


def _discard_records(orch: Orchestrator, landed: list[Claim]) -> None:
    """After completing agent claims: remove the local result records of the attempts whose
    completion committed — ``landed``, as the completion transaction reported them after its
    commit (a fenced-out one stays in flight, and its record with it; a record left behind by a
    completion whose commit was lost is pruned by ``memeflow gc``)."""
    for claim in landed:
        if claim.lane == Lane.AGENT and claim.attempt_id:
            records.discard(orch.settings.agent_results_path, records.namespace_of(claim.storage_key),
                            [claim.attempt_id])


def run_task(
    orch: Orchestrator, task_id: uuid.UUID | str, owner: str, providers: Providers, publisher: HintPublisher,
    lane: str | None = None,
) -> str:
    """Handle one hint. 'dropped' = stale, duplicate or wrong-lane hint (nothing claimed)."""
    # the agent's recall-safety is recorded on the attempt an agent claim starts
    recall_safe = lane in (None, Lane.AGENT) and recall_safe_agent(providers)
    hints: list[Hint] = []
    claim = orch.claim_task(task_id, owner, lane, hints_out=hints, recall_safe=recall_safe)
    if claim is None:
        publisher.publish(hints)  # a refusal's: this worker is free to take one itself
        return "dropped"
    handoff(publisher, hints)  # free slots for waiting tasks: another worker takes them now
    return execute_claim(orch, claim, providers, publisher)


def handle_hint(
    orch: Orchestrator, lane: str, task_id: uuid.UUID | str, owner: str, providers: Providers,
    publisher: HintPublisher, lingers: bool = False,
) -> int:
    """What a wake-up hint of ``lane`` does: claim the hinted task and its wake-up group (as a
    batch), run them, complete them together. Returns how many tasks were claimed.

    ``lingers``: this process serves ``lane`` alone (a dedicated lane worker), so it may wait
    for the lane's batch to fill (``_linger``) without holding up another lane's work."""
    n = lane_batch_size(orch.settings, lane)
    if lane == Lane.AGENT:
        return run_agent_batch(orch, task_id, owner, providers, publisher, n)
    linger = batch_linger_s(orch.settings, lane) if n > 1 and lingers else 0.0
    earlier = functools.partial(orch.earlier_lanes_pending, lane) if earlier_lanes(lane) else None
    state = _linger(lane, linger, earlier, until_queued=orch.settings.local_burst_cores != 1) if linger > 0 else None
    with cpu.burst(burst_cores(orch.settings, earlier, state)):
        claimed = run_batch(orch, lane, owner, providers, publisher, n, first_task_id=task_id)
    if linger > 0 and claimed:  # a hint that claimed nothing ran no batch: it does not make the lane busy
        _BATCH_ENDED[lane] = time.monotonic()
    return claimed


def batch_linger_s(settings, lane: str) -> float:
    """``Settings.<lane>_batch_linger_ms`` in seconds (0: claim at once)."""
    return float(getattr(settings, f"{lane}_batch_linger_ms", 0.0) or 0.0) / 1000.0


#: When this process's last batch of each lane ended (time.monotonic()).
_BATCH_ENDED: dict[str, float] = {}


#: How often a lingering worker asks whether the earlier lanes still have work (seconds).
LINGER_RECHECK_S = 0.1


def burst_cores(settings, earlier: Callable[[], tuple[bool, bool]] | None,
                state: tuple[bool, bool] | None = None) -> int:
    """The cores a batch of a lane may keep busy at once (:func:`app.stages.cpu.burst`): every core
    the worker may use (``Settings.local_burst_cores``, 0 = :func:`~app.stages.cpu.available_cores`)
    when the lane is fed by earlier lanes (``earlier``: their (queued, running) question) and none
    of them has a task queued or running — the end of a burst, when their cores are idle — else 1.
    ``state``: the linger's last answer, if it asked (so the question is asked once)."""
    cores = settings.local_burst_cores or cpu.available_cores()
    if cores <= 1 or earlier is None:
        return 1
    if state is None:
        state = earlier()
    return 1 if any(state) else cores


Pending = Callable[[], tuple[bool, bool]]


def _linger(lane: str, linger: float, earlier: Pending | None = None,
            until_queued: bool = False) -> tuple[bool, bool] | None:
    """Before claiming a batch: if this process's previous batch of ``lane`` ended less than
    ``linger`` seconds ago (the lane is busy), wait out the rest, so the tasks that become due
    meanwhile are claimed together — they join the hinted task's wake-up group, or the claim's
    fill takes them. A lane that was idle longer claims at once: no added latency when idle.
    Nothing is claimed or held while waiting (the hint's message is not acked yet: a worker that
    dies here leaves what a lost message leaves, which the sweep recovers).

    ``earlier`` (a lane fed by earlier lanes' completions): whether a task of an earlier lane is
    (queued, running), asked before each slice of the wait (every ``LINGER_RECHECK_S``). The
    worker waits while one is queued or running: once none is, nothing more can arrive but a new
    upload's, and the last documents of the burst are not held back for a batch that cannot fill
    (docs/performance-log.md §31). ``until_queued`` (``Settings.local_burst_cores`` != 1): it waits
    only while one is queued — once none is, the burst is ending, and it claims what is due now
    on the cores the earlier lanes' last tasks leave idle (§35).

    Returns ``earlier``'s last answer (None: not asked)."""
    ended = _BATCH_ENDED.get(lane)
    if ended is None:
        return None
    wait = min(ended + linger - time.monotonic(), linger)
    if wait <= 0:
        return None
    if earlier is None:
        time.sleep(wait)
        return None
    state = None
    while wait > 0:
        state = earlier()
        if not (state[0] if until_queued else any(state)):
            break
        step = min(wait, LINGER_RECHECK_S)
        time.sleep(step)
        wait -= step
    return state


def run_agent_batch(
    orch: Orchestrator, task_id: uuid.UUID | str, owner: str, providers: Providers, publisher: HintPublisher,
    n: int,
) -> int:
    """Claim up to ``n`` agent tasks for one hint (each holding a lane slot and a committed attempt),
    run their paid calls concurrently, then complete the successes in one transaction; failures and
    unprovable interrupted calls end one by one. With ``Settings.agent_completes_async`` those
    terminal writes are handed to the process's completion thread (``_Completer``) and this
    thread returns at once."""
    # an agent batch's calls, and a threads pool's, run beside others: a death charges none of them
    # (tasks.claim_txn), until a died run is recovered alone (_recover_alone)
    shared = n > 1 or COMPUTE_THREADS > 1
    hints: list[Hint] = []
    claims = orch.claim_agent_batch(task_id, n, owner, hints_out=hints, recall_safe=recall_safe_agent(providers),
                                    shared=shared)
    if not claims:
        publisher.publish(hints)  # a refusal's: this worker is free to take one itself
        return 0
    handoff(publisher, hints)  # free slots for waiting tasks: another worker takes them now
    hb = Heartbeat(orch, claims).__enter__()
    if _runs_again(claims[0]):  # a died run is claimed alone (execution.claim_agent_batch)
        return _recover_alone(orch, claims[0], providers, publisher, hb)
    try:
        with _computing(), watchdog.computing_for(hb):
            if len(claims) == 1:
                results = [_outcome(orch, claims[0], providers)]
            else:
                group = records.CallGroup(len(claims))  # the batch's result records: one flush
                results = list(_calls().map(lambda c: _watched(hb, orch, c, providers, group), claims))
    except BaseException:
        hb.__exit__(None, None, None)
        raise
    # every result record is durable by now (written before the call returned): a process killed
    # from here on leaves attempts the lease recovery adopts, whether the writes below wait or not
    if orch.settings.agent_completes_async:
        # the completion thread publishes: this thread's LocalHints chain has moved on by then
        _completer.submit(functools.partial(_finish_agent_batch, orch, claims, results,
                                            functools.partial(handoff, publisher), hb))
    else:
        _finish_agent_batch(orch, claims, results, publisher.publish, hb)
    return len(claims)


def _finish_agent_batch(orch: Orchestrator, claims: list[Claim], results: list, publish: Callable[[list[Hint]], None],
                        hb: Heartbeat) -> None:
    """An agent batch's terminal writes: the successes completed in one fenced transaction (a
    fenced-out one writes only its rejection), failures and unprovable calls one by one, the
    hints published, the landed attempts' records discarded."""
    hb.__exit__(None, None, None)  # terminal writes after the heartbeat stopped (see execute_claim)
    done = [(c, r) for c, r in zip(claims, results, strict=True) if r is not None and not isinstance(r, StageError)]
    landed: list[Claim] = []
    hints = complete_isolated(orch, done, landed)
    for claim, result in zip(claims, results, strict=True):
        if isinstance(result, StageError):
            hints += orch.fail_task(claim, result)
        elif result is None:
            hints += orch.mark_unknown_execution(claim)
    publish(hints)  # the next stage's hints first: the records' cleanup can wait
    _discard_records(orch, landed)


def recall_safe_agent(providers: Providers) -> bool:
    """Whether this worker's agent may run an interrupted attempt again (``is_recall_safe``):
    recorded on each attempt its claims start, which the recovery reads (never a message)."""
    return is_recall_safe(providers.agent)


def _runs_again(claim: Claim) -> bool:
    """A recovering agent claim whose interrupted attempt is recall-safe: it is not ended
    ``unknown_execution`` but run again (unless its lookup finds the result)."""
    return claim.lane == Lane.AGENT and claim.recovering and claim.recall_safe


def past_last_attempt(claim: Claim) -> bool:
    """A recovering claim taken after its task's last attempt died alone (``tasks.CLAIM``): it only
    looks the interrupted attempt up — adopted if the result was recorded, else the task ends —
    and never calls the agent again."""
    return claim.recovering and claim.attempt_count > claim.max_attempts


def _exclusive() -> contextlib.AbstractContextManager:
    """The gate held exclusively (no other thread of this process computes), in a process of
    several task threads: a died run's death, if it dies again, is then its own (``_ComputeGate``)."""
    return _gate.exclusive() if COMPUTE_THREADS > 1 else contextlib.nullcontext()


def _recover(orch: Orchestrator, claim: Claim, providers: Providers) -> tuple[Claim | None, object]:
    """A recall-safe attempt whose worker died, with the gate held exclusively: its result recorded
    before the death is adopted (the lookup); otherwise — unless the claim is past the last attempt
    (``past_last_attempt``: it then ends ``max_attempts_exceeded``) — the interrupted attempt ends ``failed``
    (``worker_died``) and the call runs again under a fresh attempt of the same claim, marked as
    running alone — so a poison input that kills the worker every time spends its own attempts
    and ends ``max_attempts_exceeded`` (the sweep), never a crash loop, never a neighbour's charge.
    Returns (the claim to finish, its outcome); (None, None): fenced out, nothing to write."""
    result = _outcome(orch, claim, providers)
    if result is not None:
        return claim, result
    if past_last_attempt(claim):  # the recovery claim after the last attempt's death: a lookup only
        return claim, PermanentError("every attempt's worker died before finishing; the last one recorded no result",
                                     code="max_attempts_exceeded")
    fresh = orch.restart_attempt(claim, recall_safe_agent(providers))
    if fresh is None:
        return None, None
    return fresh, _outcome(orch, fresh, providers)


def _recover_alone(orch: Orchestrator, claim: Claim, providers: Providers, publisher: HintPublisher,
                   hb: Heartbeat) -> int:
    """``run_agent_batch`` for a recovering recall-safe claim (``_recover``): its terminal writes
    are made synchronously, before the gate is let go (a death until then is still its own)."""
    with _exclusive():
        try:
            with watchdog.computing_for(hb):
                ran, result = _recover(orch, claim, providers)
        except BaseException:
            hb.__exit__(None, None, None)
            raise
        if ran is None:  # fenced out (counted): the task is another execution's now
            hb.__exit__(None, None, None)
            return 1
        _finish_agent_batch(orch, [ran], [result], publisher.publish, hb)
    return 1


def _outcome(orch: Orchestrator, claim: Claim, providers: Providers,
             group: records.CallGroup | None = None) -> object:
    """The claim's artifact, its StageError, or None (an interrupted paid call that cannot be proven)."""
    try:
        if claim.lane == Lane.AGENT:  # its result record lives under the scope's namespace
            with records.in_namespace(records.namespace_of(claim.storage_key)), records.in_group(group):
                return _compute(orch, claim, providers)
        return _compute(orch, claim, providers)
    except StageError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - turned into a typed failure, logged with context
        log.exception("stage raised", extra={"task_id": claim.task_id, "stage": claim.stage})
        return _internal_error(exc)


def _watched(hb: Heartbeat, orch: Orchestrator, claim: Claim, providers: Providers,
             group: records.CallGroup | None) -> object:
    """``_outcome`` in an agent batch's call thread, its provider calls watched on ``hb`` (an overrun
    noted on ``claim`` alone: the batch's other calls are their own)."""
    with watchdog.computing_for(hb, [claim]):
        return _outcome(orch, claim, providers, group)


def run_batch(
    orch: Orchestrator, lane: str, owner: str, providers: Providers, publisher: HintPublisher, n: int,
    first_task_id: uuid.UUID | str,
) -> int:
    """Claim the hinted task and up to ``n - 1`` more due tasks of a batched lane (within the lane's
    batch budget), compute them with one provider call, and complete them in one transaction;
    returns how many were claimed. Every claim keeps its own outcome: one item's failure never
    fails, charges or annotates another."""
    shared = COMPUTE_THREADS > 1  # other threads of this process compute beside it (_ComputeGate)
    batch = orch.claim_with_batch(first_task_id, lane, n, owner, shared=shared)
    handoff(publisher, batch.hints)  # group members the budget left out: claimable by another worker now
    claims = batch.claims
    if not claims:
        return 0
    with contextlib.ExitStack() as alone:
        hb = Heartbeat(orch, claims).__enter__()
        try:
            if shared and batch.died:  # its last run died: run it with no other thread computing
                alone.enter_context(_gate.exclusive())
                if not orch.run_alone(claims[0]):  # fenced out while it waited: not ours to run
                    return len(claims)
                with watchdog.computing_for(hb):
                    results = _compute_isolated(orch, lane, claims, providers)
            else:
                with _computing(), watchdog.computing_for(hb):
                    results = _compute_isolated(orch, lane, claims, providers)
        finally:
            hb.__exit__(None, None, None)
        # terminal writes after the heartbeat stopped (see execute_claim); a run alone keeps the
        # gate until they are done: until then a death of the process is still charged to it
        done = [(c, r) for c, r in zip(claims, results, strict=True) if not isinstance(r, StageError)]
        hints = complete_isolated(orch, done)
        for claim, result in zip(claims, results, strict=True):
            if isinstance(result, StageError):
                hints += orch.fail_task(claim, result)
    publisher.publish(hints)
    return len(claims)


#: The code of a result the database refused, by lane: the provider's output was bad.
_UNSTORABLE_CODE = {Lane.AGENT: "agent_bad_output"}


def complete_isolated(orch: Orchestrator, done: list[tuple[Claim, object]],
                      landed: list[Claim] | None = None) -> list[Hint]:
    """``orch.complete_tasks(done, landed)``; should the database refuse a value of one result
    (``UnstorableResult``: the transaction wrote nothing), each claim is completed alone, and the
    one refused fails with its provider's bad output — never its batch-mates (SPEC §10), whose
    results (an agent's paid answer) are kept. The providers' checks keep such values out
    (``executor.checked_vector``, the agents' parsers); this is the net behind them."""
    if not done:
        return []
    try:
        return orch.complete_tasks(done, landed)
    except UnstorableResult as exc:
        if len(done) == 1:
            claim = done[0][0]
            log.warning("the database refused a %s result", claim.lane, extra={"task_id": claim.task_id},
                        exc_info=exc)
            return orch.fail_task(claim, PermanentError(
                "the provider's output cannot be stored", code=_UNSTORABLE_CODE.get(claim.lane, "provider_bad_output")))
        log.warning("the database refused a value of a %s batch of %d; completing each alone",
                    done[0][0].lane, len(done))
    return [hint for item in done for hint in complete_isolated(orch, [item], landed)]


def _compute_isolated(orch: Orchestrator, lane: str, claims: list[Claim], providers: Providers) -> list:
    """The batch's outcomes, one per claim. The executor isolates bad inputs and provider failures
    per item; should the batch step fail as a whole anyway (e.g. reading the documents' inputs),
    each claim is computed again on its own before any of them is charged."""
    try:
        return _compute_batch(orch, lane, claims, providers)
    except Exception as exc:  # noqa: BLE001 - re-run singly below
        if len(claims) == 1:
            log.exception("stage raised", extra={"lane": lane, "task_id": claims[0].task_id})
            return [_internal_error(exc)]
        log.warning("a %s batch of %d failed as a whole; computing each claim alone", lane, len(claims),
                    extra={"lane": lane, "code": type(exc).__name__})
    return [_compute_isolated(orch, lane, [claim], providers)[0] for claim in claims]


def handoff(publisher: HintPublisher, hints: list[Hint]) -> None:
    """Publish ``hints`` to the broker even when ``publisher`` keeps hints to run locally: they name
    work another worker should take now, alongside this one."""
    if hints:
        getattr(publisher, "handoff", publisher.publish)(hints)


class LocalHints:
    """The publisher of one delivered hint's handling when the worker continues hints locally.

    Of the hints a handling returns, the first for a lane this worker consumes is kept, to be
    handled here right after (``handle_hint_locally``) instead of published and delivered back to
    some worker: a chain of at most ``limit`` kept hints per delivered message, one at a time.
    Every other hint — another lane's, a second one of the same handling (another worker can take
    it now, in parallel), a delayed one (an ``eta``), one past the limit, one still kept when the
    chain stops — goes to ``broker``. Keeping a hint changes nothing in PostgreSQL: its task is
    queued and hinted (``last_hint_at``) exactly as if the message were in the broker, so a worker
    that dies before claiming it leaves what a lost message leaves, and the sweep re-hints it after
    ``rehint_grace_s``.
    """

    def __init__(self, broker: HintPublisher, lanes: Collection[str], limit: int) -> None:
        self.broker, self.lanes, self.left = broker, frozenset(lanes), limit
        self.kept: Hint | None = None

    def publish(self, hints: Iterable[Hint]) -> None:
        out = []
        for hint in hints:
            # a delayed hint (eta) goes to the broker, which holds it until then: claimed now, its
            # task would not be due yet and the hint would be spent, leaving it to the sweep
            if self.kept is None and self.left > 0 and str(hint.lane) in self.lanes and hint.eta is None:
                self.kept, self.left = hint, self.left - 1
            else:
                out.append(hint)
        if out:
            self.broker.publish(out)

    def handoff(self, hints: Iterable[Hint]) -> None:
        self.broker.publish(hints)

    def take(self) -> Hint | None:
        hint, self.kept = self.kept, None
        return hint

    def release(self) -> None:
        """Publish the kept hint, if any, and keep no more."""
        self.left = 0
        hint = self.take()
        if hint is not None:
            self.broker.publish([hint])


def handle_hint_locally(
    orch: Orchestrator, lane: str, task_id: uuid.UUID | str, owner: str, providers: Providers,
    publisher: HintPublisher, lanes: Collection[str], limit: int, busy: Callable[[], bool] = lambda: False,
    lingers: bool = False,
) -> int:
    """``handle_hint``, then — here and now, through the same claim, admission and completion as a
    delivered hint — the hint its completion returned for one of ``lanes`` (the lanes this worker
    consumes), and so on, at most ``limit`` times (``LocalHints``). Stops early, publishing the
    kept hint, when ``busy()`` says other deliveries wait for this worker, or on any error. Returns
    how many tasks were claimed in all."""
    local = LocalHints(publisher, lanes, limit)
    try:
        claimed = handle_hint(orch, lane, task_id, owner, providers, local, lingers)
        while local.kept is not None and not busy():
            hint = local.take()
            metrics.HINTS_CONTINUED.labels(lane=hint.lane).inc()
            claimed += handle_hint(orch, hint.lane, hint.task_id, owner, providers, local, lingers)
    finally:
        local.release()
    return claimed
