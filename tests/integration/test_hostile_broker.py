"""Hostile broker input against real Celery workers (docs/security.md, "Broker messages").

Anyone who can write to Redis can put anything in a queue. A hint is a wake-up for an id that
PostgreSQL then judges, so whatever arrives — bytes that are not JSON, a body that is not base64,
a pickle, an unknown task, wrong arguments, a huge or NUL-laden id, another lane's task, an eta
a century away, an expiry in the past, a flood of duplicates — must be logged and dropped (acked),
change nothing in PostgreSQL, and leave the worker serving: a real job hinted afterwards still
finishes (polled with a deadline). Messages are pushed to the queues raw (LPUSH), as a hostile
writer would, not through Celery's client.
"""

from __future__ import annotations

import base64
import json
import pickle
import uuid

import pytest
import redis as redis_lib
from sqlalchemy import text

from tests.conftest import poll_until
from tests.integration.conftest import ingest, job_statuses, make_publisher, wait_jobs_terminal

pytestmark = pytest.mark.slow

LANES = ("visual", "agent", "embedding")


def _template(broker_url: str) -> dict:
    """A genuine hint message as kombu puts it in Redis (taken from a throwaway queue)."""
    from celeryconfig import LANE_TASKS

    _p, app = make_publisher(broker_url)
    try:
        app.send_task(LANE_TASKS["visual"], args=[str(uuid.uuid4())], queue="visual", routing_key="visual")
    finally:
        app.close()
    client = redis_lib.Redis.from_url(broker_url)
    try:
        raw = client.rpop("visual")
    finally:
        client.close()
    assert raw is not None
    return json.loads(raw)


def _message(template: dict, lane: str, task: str | None = None, args=None, kwargs=None, body: bytes | None = None,
             content_type: str | None = None, **headers) -> bytes:
    from celeryconfig import LANE_TASKS

    msg = json.loads(json.dumps(template))
    tid = str(uuid.uuid4())
    msg["headers"].update(id=tid, root_id=tid, task=task or LANE_TASKS.get(lane, lane), **headers)
    msg["properties"].update(correlation_id=tid, delivery_tag=str(uuid.uuid4()),
                             delivery_info={"exchange": lane, "routing_key": lane})
    if body is None:
        body = json.dumps([args if args is not None else [str(uuid.uuid4())], kwargs or {},
                           {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
    msg["body"] = base64.b64encode(body).decode()
    if content_type:
        msg["content-type"] = content_type
    return json.dumps(msg).encode()


def _garbage(template: dict, finished: list[tuple[str, str]]) -> list[tuple[str, bytes]]:
    """(queue, raw bytes) of every hostile message the test sends."""
    from celeryconfig import LANE_TASKS

    out: list[tuple[str, bytes]] = []
    for lane in (*LANES, "maintenance"):
        out += [
            (lane, b"\x00\xff not json {"),
            (lane, b"[1, 2, 3]"),
            (lane, b"null"),
            (lane, b'"a string"'),
            (lane, b"{}"),
            (lane, json.dumps({"body": "x", "headers": {}, "properties": {}}).encode()),
        ]
        broken = json.loads(_message(template, lane))
        broken["body"] = "!!! not base64 ~~~"
        out.append((lane, json.dumps(broken).encode()))
        no_props = json.loads(_message(template, lane))
        del no_props["properties"]
        out.append((lane, json.dumps(no_props).encode()))
        out += [
            (lane, _message(template, lane, task="memeflow.no_such_task")),
            (lane, _message(template, lane, task="celery.chord_unlock")),
            (lane, _message(template, lane, body=pickle.dumps(([str(uuid.uuid4())], {}, {})),
                            content_type="application/x-python-serialize")),
            (lane, _message(template, lane, body=b"{not json", content_type="application/json")),
            (lane, _message(template, lane, body=b"\x00\x01", content_type="application/x-yaml")),
        ]
    for lane in LANES:
        out += [
            (lane, _message(template, lane, args=[])),
            (lane, _message(template, lane, args=[str(uuid.uuid4()), "local"])),
            (lane, _message(template, lane, kwargs={"scope_id": "local"})),
            (lane, _message(template, lane, args=[{"id": str(uuid.uuid4())}])),
            (lane, _message(template, lane, args=[12345])),
            (lane, _message(template, lane, args=[None])),
            (lane, _message(template, lane, args=["a" * 2_000_000])),
            (lane, _message(template, lane, args=["\x00" * 64])),
            (lane, _message(template, lane, args=[str(uuid.uuid4()) + "\x00"])),
            (lane, _message(template, lane, args=[str(uuid.uuid4())], argsrepr="x" * 1_000_000)),
            (lane, _message(template, lane, args=[str(uuid.uuid4())], junk="y" * 1_000_000)),
            (lane, _message(template, lane, body=b"[" * 200_000 + b"]" * 200_000)),
            (lane, _message(template, lane, eta="2999-01-01T00:00:00+00:00")),
            (lane, _message(template, lane, eta="not a date")),
            (lane, _message(template, lane, expires="2001-01-01T00:00:00+00:00")),
            (lane, _message(template, lane, expires="not a date")),
            (lane, _message(template, lane, timelimit=["x", "y"])),
        ]
    for task_id, lane in finished:  # finished tasks, each also sent to the other lanes' queues
        for other in LANES:
            out.append((other, _message(template, other, args=[task_id])))
            out.append((other, _message(template, other, task=LANE_TASKS[lane], args=[task_id])))
    return out


def _drained(broker_url: str) -> bool:
    client = redis_lib.Redis.from_url(broker_url)
    try:
        return all(client.llen(q) == 0 for q in (*LANES, "maintenance")) and client.hlen("unacked") == 0
    finally:
        client.close()


def _snapshot(engine):
    with engine.connect() as conn:
        return sorted(map(tuple, conn.execute(text(
            "SELECT id, scope_id, status, claim_generation, attempt_count, lease_owner, updated_at FROM tasks"
        )).all()))


def test_garbage_messages_are_dropped_and_the_workers_keep_serving(cluster, engine, publisher, broker_url, orch):
    template = _template(broker_url)
    workers = [cluster.worker(lane, wait=False) for lane in LANES]
    for proc in workers:
        cluster.wait_ready(proc)
    first = ingest(orch, cluster.settings, 1)
    publisher.publish(first.hints)
    assert wait_jobs_terminal(engine, [first.job["id"]], timeout=60) == {"succeeded": 1}
    with engine.connect() as conn:
        finished = [(str(t), lane) for t, lane in conn.execute(
            text("SELECT id, lane FROM tasks WHERE job_id = :j"), {"j": first.job["id"]}).all()]
    before = _snapshot(engine)

    client = redis_lib.Redis.from_url(broker_url)
    try:
        for queue, raw in _garbage(template, finished):
            client.lpush(queue, raw)
        flood = [_message(template, "visual", args=[finished[0][0]]) for _ in range(300)]
        client.lpush("visual", *flood)
    finally:
        client.close()

    poll_until(lambda: _drained(broker_url), timeout=120, interval=0.2, what="every hostile message acked")
    assert all(w.alive for w in workers), [w.log()[-3000:] for w in workers if not w.alive]
    assert _snapshot(engine) == before  # nothing claimed, nothing written

    second = ingest(orch, cluster.settings, 2)  # the workers still serve
    publisher.publish(second.hints)
    assert wait_jobs_terminal(engine, [second.job["id"]], timeout=60) == {"succeeded": 1}
    assert all(w.alive for w in workers)
    assert job_statuses(engine, [first.job["id"]]) == {"succeeded": 1}
