"""One scope cannot hold the webhook delivery lane (docs/events.md "Sharing the lane").

The lane runs in-process as a webhooks worker runs it: a hint poller and ``WEBHOOK_THREADS``
threads taking hints from one queue, delivering through a fake sender. The hog's receivers answer
slowly — a send returns once the victim has been served, or after ``SLOW_S`` (a receiver answering
just inside the timeout) — so what is measured is structural, not a wall-time threshold: how many
of the hog's deliveries complete before the victim's one event is delivered. Fair, that is at most
the deliveries already in flight when the victim's event commits, one per thread (each finishes
the delivery it is in, then hands over), and one more (FAIR_BOUND). Unfair — one FIFO of hints
whose claims deliver 50 events each — it is hundreds; the run stops as soon as the bound is
passed, after two rounds of slow deliveries.

The deterministic tests below check the rules themselves: admission, hand-over, hint order.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import text

from app.cli.processes import WEBHOOK_THREADS
from app.orchestrator import Orchestrator
from app.orchestrator.store import events as events_q
from app.worker.webhook_sender import SendResult
from app.worker.webhooks import deliver_subscription
from tests.conftest import poll_until

#: How long a hog receiver takes to answer while the victim waits: far longer than the lane's own
#: work of handing over, draining refused hints and claiming (milliseconds; seconds on a very busy
#: box), so a fair lane serves the victim inside one hog delivery.
SLOW_S = 2.0
#: The hog deliveries that may complete before the victim's: the ones in flight on every thread
#: when its event commits, plus one of the claim a scope keeps while the victim waits for a free
#: thread (one in flight is no more than the victim's share).
FAIR_BOUND = WEBHOOK_THREADS + 1


class Lane:
    """The webhooks lane in-process: a hint poller and ``threads`` delivery threads on one queue,
    counting the hog's completed deliveries (URLs with ``/hog/``) until the victim's is sent."""

    def __init__(self, orch: Orchestrator, threads: int = WEBHOOK_THREADS) -> None:
        self.orch = orch
        self.hints: queue.Queue = queue.Queue()
        self.served = threading.Event()  # the victim's event was delivered
        self.hog_sending = 0  # hog deliveries in flight
        self.hog_done = 0  # hog deliveries completed
        self.hog_done_before_victim: int | None = None
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._guard(self._poll), name="poller", daemon=True)
        self._workers = [threading.Thread(target=self._guard(self._work), name=f"w{i}", daemon=True)
                         for i in range(threads)]

    def send(self, url: str, secret: str, event: dict, **kw) -> SendResult:
        if "/hog/" in url:
            with self._lock:
                self.hog_sending += 1
            self.served.wait(SLOW_S)
            with self._lock:
                self.hog_sending -= 1
                self.hog_done += 1
        else:
            with self._lock:
                if self.hog_done_before_victim is None:
                    self.hog_done_before_victim = self.hog_done
            self.served.set()
        return SendResult(True, 200)

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
                self.errors.append(exc)
        return run

    def _poll(self) -> None:
        while not self._stop.is_set():
            for hint in self.orch.webhook_hints():
                self.hints.put(hint)
            self._stop.wait(self.orch.settings.webhook_poll_s)

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                hint = self.hints.get(timeout=0.05)
            except queue.Empty:
                continue
            for more in deliver_subscription(self.orch, hint.task_id, threading.current_thread().name,
                                             send=self.send):
                self.hints.put(more)

    def start_poller(self) -> Lane:
        self._poller.start()
        return self

    def start_workers(self) -> Lane:
        for t in self._workers:
            t.start()
        return self

    def __enter__(self) -> Lane:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.served.set()  # release the hog's waiting sends
        for t in (self._poller, *self._workers):
            if t.is_alive():
                t.join(10)

    def wait_for_victim(self) -> int:
        """Run until the victim is served or the hog passed the fair bound; the hog deliveries that
        completed before the victim's (the hog's count so far if it never was)."""
        poll_until(lambda: self.served.is_set() or self.hog_done > FAIR_BOUND or self.errors,
                   timeout=120, interval=0.01, what="the victim's delivery or the hog past the bound")
        assert not self.errors, self.errors
        with self._lock:
            if self.hog_done_before_victim is None:
                return self.hog_done  # the victim is still waiting
            return self.hog_done_before_victim


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings.replace(webhook_allowed_networks="127.0.0.0/8", webhook_poll_s=0.02))


def backlog(orch: Orchestrator, scope: str, n: int) -> None:
    """``n`` events of ``scope`` committed at once."""
    with orch.engine.begin() as c:
        for i in range(n):
            events_q.stage_event_txn(c, scope, "batch.progress", {"n": i})


def victim_event(orch: Orchestrator) -> None:
    with orch.engine.begin() as c:
        events_q.stage_event_txn(c, "victim", "image.deleted", {"image_id": None})


def subscribe(orch: Orchestrator, scope: str, path: str) -> uuid.UUID:
    return uuid.UUID(orch.create_webhook(scope, f"http://127.0.0.1:9{path}")[0]["id"])


def test_a_victim_hinted_behind_a_hogs_backlog_is_served_first(orch):
    """The audit's case: a scope with ``webhooks_per_scope`` subscriptions and a full claim of
    events for each, and the victim's hint queued behind all of theirs — the hog's claims beyond
    the first are refused while the victim waits, so its hint comes up at once."""
    s = orch.settings
    for i in range(s.webhooks_per_scope):
        subscribe(orch, "hog", f"/hog/{i}")
    backlog(orch, "hog", s.webhooks_per_scope * s.webhook_events_per_claim)
    subscribe(orch, "victim", "/victim")
    with Lane(orch) as lane:
        lane.start_poller()
        poll_until(lambda: lane.hints.qsize() == s.webhooks_per_scope, timeout=30, what="the hog's hints")
        victim_event(orch)
        poll_until(lambda: lane.hints.qsize() == s.webhooks_per_scope + 1, timeout=30, what="the victim's hint")
        lane.start_workers()
        done = lane.wait_for_victim()
    assert done <= FAIR_BOUND, f"the hog completed {done} deliveries while the victim's one waited"


def test_a_hog_holding_every_thread_hands_over_when_another_scope_waits(orch):
    """The victim's event commits while the hog's claims are on every thread: each finishes the
    delivery in flight and hands over, so the victim waits for at most one delivery per thread."""
    s = orch.settings
    for i in range(s.webhooks_per_scope):
        subscribe(orch, "hog", f"/hog/{i}")
    backlog(orch, "hog", s.webhooks_per_scope * s.webhook_events_per_claim)
    subscribe(orch, "victim", "/victim")
    with Lane(orch) as lane:
        lane.start_poller().start_workers()
        poll_until(lambda: lane.hog_sending == WEBHOOK_THREADS, timeout=30, what="the hog on every thread")
        victim_event(orch)
        done = lane.wait_for_victim()
    assert done <= FAIR_BOUND, f"the hog completed {done} deliveries while the victim's one waited"


def test_many_scopes_within_their_share_hand_over_at_the_claim_budget(orch):
    """One subscription each for as many hog scopes as there are threads: no scope has more than
    its share, so it is the claim budget (shorter than one slow delivery here) that hands over."""
    orch.settings = orch.settings.replace(webhook_claim_budget_s=SLOW_S / 2)
    for i in range(WEBHOOK_THREADS):
        subscribe(orch, f"hog-{i}", f"/hog/{i}")
        backlog(orch, f"hog-{i}", orch.settings.webhook_events_per_claim)
    subscribe(orch, "victim", "/victim")
    with Lane(orch) as lane:
        lane.start_poller().start_workers()
        poll_until(lambda: lane.hog_sending == WEBHOOK_THREADS, timeout=30, what="the hogs on every thread")
        victim_event(orch)
        done = lane.wait_for_victim()
    assert done <= FAIR_BOUND, f"the hogs completed {done} deliveries while the victim's one waited"


# ------------------------------------------------------------------ the rules, one step at a time
def _hinted(orch: Orchestrator, sub: uuid.UUID) -> bool:
    with orch.engine.connect() as c:
        return c.execute(text("SELECT last_hint_at IS NOT NULL FROM webhook_subscriptions WHERE id = :id"),
                         {"id": sub}).scalar_one()


def test_a_lone_scope_takes_every_thread_and_is_refused_more_only_while_another_waits(orch):
    hog = [subscribe(orch, "hog", f"/hog/{i}") for i in range(WEBHOOK_THREADS + 1)]
    backlog(orch, "hog", 3)
    claims = [orch.claim_webhook(sub, f"w{i}") for i, sub in enumerate(hog[:WEBHOOK_THREADS])]
    assert all(c is not None for c in claims)  # nobody else waits: the lane is all the hog's
    assert [h.task_id for h in orch.webhook_hints()] == [hog[-1]]
    victim = subscribe(orch, "victim", "/victim")
    victim_event(orch)
    assert [h.task_id for h in orch.webhook_hints()] == [victim]
    assert orch.claim_webhook(hog[-1], "w-late") is None  # refused: a scope with fewer claims waits
    assert not _hinted(orch, hog[-1])  # its hint is spent ...
    assert orch.webhook_hints() == []  # ... and it is not hinted again while the victim waits
    assert orch.webhook_should_hand_over(claims[0])  # the hog's claims hand over after their delivery
    assert orch.claim_webhook(victim, "w-victim") is not None
    assert not orch.webhook_should_hand_over(claims[0])  # nobody waits any more
    assert [h.task_id for h in orch.webhook_hints()] == [hog[-1]]
    assert orch.claim_webhook(hog[-1], "w-late") is not None


def test_hints_take_scopes_in_turn(orch):
    a = [subscribe(orch, "alpha", f"/a/{i}") for i in range(3)]
    b = [subscribe(orch, "beta", f"/b/{i}") for i in range(2)]
    backlog(orch, "alpha", 1)
    backlog(orch, "beta", 1)
    assert [h.task_id for h in orch.webhook_hints()] == [a[0], b[0], a[1], b[1], a[2]]


def test_a_claim_that_hands_over_goes_behind_its_scopes_other_subscriptions(orch):
    subs = [subscribe(orch, "local", f"/x/{i}") for i in range(2)]
    backlog(orch, "local", 2)
    claim = orch.claim_webhook(subs[0], "w")
    assert [h.task_id for h in orch.hand_over_webhook(claim)] == [subs[1]]  # the one waiting longer
    assert [h.task_id for h in orch.webhook_hints()] == [subs[0]]  # then itself
    assert orch.claim_webhook(subs[0], "w2") is not None  # released: claimable again


def test_a_lone_subscription_that_hands_over_hints_itself(orch):
    sub = subscribe(orch, "local", "/x")
    backlog(orch, "local", 2)
    claim = orch.claim_webhook(sub, "w")
    assert [h.task_id for h in orch.hand_over_webhook(claim)] == [sub]
    assert orch.hand_over_webhook(claim) == []  # fenced: no longer its claim (and already hinted)


class RecordingLane(Lane):
    """The lane delivering at once, recording each URL's event ids in the order sent."""

    def __init__(self, orch: Orchestrator) -> None:
        super().__init__(orch)
        self.got: dict[str, list[int]] = {}

    def send(self, url: str, secret: str, event: dict, **kw) -> SendResult:
        with self._lock:
            self.got.setdefault(url, []).append(event["id"])
        return SendResult(True, 200)


def test_turns_handed_over_and_refused_keep_every_subscription_in_order_exactly_once(orch):
    """Scopes racing for the lane, claims handing over after every two events: each subscription
    still gets each of its scope's events once, in id order."""
    orch.settings = orch.settings.replace(webhook_events_per_claim=2)
    scopes = {f"s{i}": [f"http://127.0.0.1:9/s{i}/{k}" for k in range(3)] for i in range(3)}
    for scope, urls in scopes.items():
        for url in urls:
            orch.create_webhook(scope, url)
    for scope in scopes:
        backlog(orch, scope, 12)
    expected = {}
    with orch.engine.connect() as c:
        for scope, urls in scopes.items():
            ids = [r["id"] for r in events_q.events_after_txn(c, scope, 0, 100)]
            expected.update({url: ids for url in urls})
    with RecordingLane(orch) as lane:
        lane.start_poller().start_workers()
        poll_until(lambda: all(len(lane.got.get(u, [])) >= len(ids) for u, ids in expected.items()) or lane.errors,
                   timeout=60, what="every subscription's events")
    assert not lane.errors, lane.errors
    assert lane.got == expected
