"""Tenant isolation on every route of the app, in token mode (SPEC §2.6, §9).

Two scopes, alpha (A) and beta (B), each with real data made through the pipeline: images, jobs,
tasks, a context edit, a batch, a webhook, events. Then, walking the app's ``url_map`` (the API,
/ops, the library, the serving routes, login, metrics, docs, static files), every rule and method
is called as B with each of A's IDs in every position that takes an ID — path, query, JSON body,
cursor, ``after``/``Last-Event-ID``, ``If-None-Match``/``v=`` of A's sha256 — and the answer must
be exactly what B gets for a random ID of the same kind (status, headers, body; IDs normalised),
A's rows and files must not change, and no response B gets may carry anything of A's (ids, sha256s,
names, texts, the webhook URL, the storage namespace). B's events, webhook deliveries, /ops and
searches (by A's exact text, by A's exact bytes) carry nothing of A's either — nor any count of
A's activity on /ops: B's figures do not move when A's work is queued, re-hinted or fenced out.
(Event ids come from one deployment-wide sequence, so their gaps do count all scopes' events: a
documented limit, docs/security.md.)

A rule without an isolation case here fails the test (``COVERAGE``), so a new route needs one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from app.api import create_app
from app.auth import TokenScopeResolver, create_scope, create_token
from app.orchestrator import Orchestrator
from app.worker.webhooks import deliver_subscription
from tests.api.conftest import png_bytes, upload
from tests.api.test_hostile_input_all_routes import _fill, _static_names
from tests.conftest import poll_until
from tests.ops.helpers import SAME_ORIGIN, page_csrf_token, page_event, page_lane
from tests.support.pipeline import Workers
from tests.support.receiver import Receiver

A, B = "alpha", "beta"
A_TEXT = "quixotic zebracorn alphasecret"  # A's title: B searching for it exactly must find nothing of A
B_TEXT = "sturdy walrus betaonly"


# --- the two scopes ---------------------------------------------------------------------------


@dataclass
class Tenant:
    scope: str
    headers: dict[str, str]
    images: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)
    webhooks: list[str] = field(default_factory=list)
    shas: list[str] = field(default_factory=list)
    bytes_: list[bytes] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    cursors: dict[str, str] = field(default_factory=dict)
    markers: set[str] = field(default_factory=set)  # strings none of the other scope's answers may hold


def _settings(settings):
    return settings.replace(
        auth="token", metrics_token="metrics-secret", webhook_allowed_networks="127.0.0.0/8",
        webhook_backoff_base_s=0.01, webhook_backoff_max_s=0.02, webhook_timeout_s=2.0,
        event_max_wait_s=0.05, event_stream_max_s=0.05, event_heartbeat_s=0.02, event_poll_s=0.01,
    )


def _ok(resp, *codes: int) -> dict:
    assert resp.status_code in (codes or (200,)), (resp.status_code, resp.get_data(as_text=True)[:500])
    return resp.get_json()


def _job(client, t: Tenant, job_id: str) -> dict:
    return _ok(client.get(f"/api/v1/jobs/{job_id}", headers=t.headers))


def _done(client, t: Tenant, job_id: str) -> bool:
    return _job(client, t, job_id)["status"] == "succeeded"


def _populate(client, orch, publisher, t: Tenant, receiver: Receiver, seed: int, words: str) -> None:
    """Real data of one scope (workers are running): a webhook first (it then gets every event),
    two processed images, a context edit, an unprocessed image, a batch over the library."""
    hook = _ok(client.post("/api/v1/webhooks", json={"url": receiver.url(f"/ok/{t.scope}-hook")},
                           headers=t.headers), 201)
    t.webhooks.append(hook["webhook"]["id"])
    for i in range(2):
        data = png_bytes((seed, 40 * i + 10, 200 - seed), size=(40 + i, 30))
        body = _ok(upload(client, data, headers=t.headers, display_name=f"{words} {i}"), 201)
        t.images.append(body["image"]["id"])
        t.jobs.append(body["job"]["id"])
        t.shas.append(body["image"]["sha256"])
        t.bytes_.append(data)
    for job_id in list(t.jobs):
        poll_until(lambda j=job_id: _done(client, t, j), what=f"{t.scope} job {job_id}")
    edited = _ok(client.patch(f"/api/v1/images/{t.images[0]}", headers=t.headers,
                              json={"context": {"title": words, "description": f"{words} described",
                                                "tags": [words.split()[0]]}}))
    t.jobs.append(edited["job"]["id"])
    poll_until(lambda: _done(client, t, edited["job"]["id"]), what=f"{t.scope} context edit job")
    idle = png_bytes((seed, 1, 1), size=(20, 20))
    body = _ok(upload(client, idle, headers=t.headers, process=False, display_name=f"{words} idle"), 201)
    t.images.append(body["image"]["id"])
    t.shas.append(body["image"]["sha256"])
    t.bytes_.append(idle)
    batch = _ok(client.post("/api/v1/batches", json={"all": True}, headers=t.headers), 202)["batch"]
    t.batches.append(batch["id"])

    def batch_done() -> bool:
        # the sweep finishes a batch whose items are done (its webhook hints: delivered later, by hand)
        publisher.publish([h for h in orch.sweep().hints if h.lane != "webhooks"])
        return _ok(client.get(f"/api/v1/batches/{batch['id']}", headers=t.headers))["batch"]["status"] == "completed"

    poll_until(batch_done, what=f"{t.scope} batch")


def _collect(client, engine, t: Tenant) -> None:
    """Every id of the scope (jobs and tasks of all revisions, events, cursors) and its markers."""
    jobs = _ok(client.get("/api/v1/jobs", query_string={"limit": 100}, headers=t.headers))["items"]
    t.jobs = sorted({j["id"] for j in jobs} | set(t.jobs))
    t.tasks = sorted({s["task_id"] for j in jobs for s in j["stages"] if s["task_id"]})
    t.event_ids = [e["id"] for e in _ok(client.get("/api/v1/events", query_string={"limit": 100},
                                                    headers=t.headers))["events"]]
    assert t.event_ids and len(t.tasks) >= 3
    t.cursors["images"] = _ok(client.get("/api/v1/images", query_string={"limit": 1}, headers=t.headers))["next_cursor"]
    t.cursors["jobs"] = _ok(client.get("/api/v1/jobs", query_string={"limit": 1}, headers=t.headers))["next_cursor"]
    # the library pages back 60 images at a time: its cursor for the scope, as the page would issue it
    first = _ok(client.get("/api/v1/images", query_string={"limit": 1}, headers=t.headers))["items"][0]
    codec = client.application.extensions["memeflow"].cursors
    t.cursors["library"] = codec.encode((datetime.fromisoformat(first["created_at"]), uuid.UUID(first["id"])),
                                        "library", t.scope)
    with engine.connect() as conn:
        ns = conn.execute(text("SELECT storage_namespace FROM scopes WHERE id = :s"), {"s": t.scope}).scalar_one()
    t.markers |= {*t.images, *t.jobs, *t.tasks, *t.batches, *t.webhooks, *t.shas, str(ns), f"{t.scope}-hook"}
    t.markers |= {w for w in (A_TEXT if t.scope == A else B_TEXT).split()}
    t.markers |= {uuid.UUID(x).hex for x in [*t.images, *t.jobs, *t.tasks, *t.batches, *t.webhooks]}


# --- what must not change: A's rows and files ---------------------------------------------------


def _scoped_tables(conn) -> list[str]:
    return [r[0] for r in conn.execute(text(
        "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t"
        " ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
        " WHERE c.table_schema = 'public' AND c.column_name = 'scope_id' AND t.table_type = 'BASE TABLE'"
        " ORDER BY 1"))]


def _rows_of(engine, scope: str, tables: list[str]) -> dict[str, str]:
    """A digest of every row of ``scope`` in every table that has a ``scope_id``."""
    with engine.connect() as conn:
        rows = {t: conn.execute(text(
            f"SELECT count(*) || ':' || coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '')"
            f" FROM {t} x WHERE scope_id = :s"), {"s": scope}).scalar_one() for t in tables}
        rows["scopes"] = conn.execute(text("SELECT x::text FROM scopes x WHERE id = :s"), {"s": scope}).scalar_one()
        return rows


def _files_of(root: Path, namespace_markers: set[str]) -> frozenset[str]:
    return frozenset(os.path.join(d, f) for d, _, names in os.walk(root) for f in names
                     if any(m in d or m in f for m in namespace_markers))


# --- one isolation case: the same request with A's id and with a random id --------------------


@dataclass
class Case:
    """A request builder taking the id under test; ``kind`` says which of A's ids it gets."""

    method: str
    rule: str
    kind: str  # image | job | task | batch | webhook | sha | cursor:<kind> | none
    build: Callable[[str], dict[str, Any]]  # id → test-client kwargs (path included)
    what: str = ""


def _path(rule: str, value: str) -> str:
    return _fill(rule, {name: value for name in re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule)})


def _png_form(data: bytes, **extra: str) -> dict[str, Any]:
    return {"data": {"file": (io.BytesIO(data), "x.png"), **extra}, "content_type": "multipart/form-data"}


def _id_cases(a: Tenant, b: Tenant) -> Iterator[Case]:
    """Every rule and method that takes an id somewhere, with the request that carries it."""
    img = "/api/v1/images/<uuid:image_id>"
    fresh = png_bytes((7, 77, 177), size=(33, 21))

    def path_case(method: str, rule: str, kind: str, what: str = "", **kw: Any) -> Case:
        return Case(method, rule, kind, lambda v: {"path": _path(rule, v), **kw}, what)

    for method in ("GET", "HEAD"):
        yield path_case(method, img, "image")
        yield path_case(method, img + "/content", "image")
        yield path_case(method, img + "/thumbnail", "image")
        yield path_case(method, "/api/v1/jobs/<uuid:job_id>", "job")
        yield path_case(method, "/api/v1/tasks/<uuid:task_id>", "task")
        yield path_case(method, "/api/v1/batches/<uuid:batch_id>", "batch")
        yield path_case(method, "/ops/images/<uuid:image_id>", "image")
        yield path_case(method, "/ops/images/<uuid:image_id>/content", "image")
        yield path_case(method, "/library/images/<uuid:image_id>", "image")
    # the image's sha256 as a version or a validator: never a 304 or another answer than a miss
    for sha_rule in (img + "/thumbnail", img + "/content", "/ops/images/<uuid:image_id>/content"):
        yield Case("GET", sha_rule, "image+sha",
                   lambda v, r=sha_rule: {"path": _path(r, v.split("+")[0]), "headers": {"If-None-Match": f'"{v.split("+")[1]}"'},
                                          **({"query_string": {"v": v.split("+")[1]}} if "thumbnail" in r else {})},
                   "If-None-Match / v= of A's sha256")
    yield path_case("PATCH", img, "image", json={"display_name": "stolen"})
    yield path_case("PATCH", img, "image", "context edit", json={"context": {"title": "stolen", "tags": ["x"]}})
    yield path_case("DELETE", img, "image")
    yield path_case("PUT", img + "/content", "image", "fresh bytes", **_png_form(fresh))
    yield Case("PUT", img + "/content", "image", lambda v: {"path": _path(img + "/content", v), **_png_form(a.bytes_[1])},
               "A's own bytes of another image")
    yield path_case("POST", img + "/process", "image", json={})
    yield path_case("POST", img + "/process", "image", "force", json={"force_stages": ["visual"]})
    yield path_case("POST", "/api/v1/jobs/<uuid:job_id>/retry", "job")
    yield path_case("POST", "/api/v1/jobs/<uuid:job_id>/cancel", "job")
    yield path_case("POST", "/api/v1/batches/<uuid:batch_id>/cancel", "batch")
    yield path_case("DELETE", "/api/v1/webhooks/<uuid:webhook_id>", "webhook")
    yield Case("POST", "/ops/jobs/<uuid:job_id>/retry", "job", lambda v: {"path": f"/ops/jobs/{v}/retry", "ops_form": True})
    # ids in a query string or a JSON body
    yield Case("GET", "/api/v1/jobs", "image", lambda v: {"path": "/api/v1/jobs", "query_string": {"image_id": v}})
    yield Case("POST", "/api/v1/batches", "image", lambda v: {"path": "/api/v1/batches", "json": {"image_ids": [v]}})
    yield Case("POST", "/api/v1/batches", "image", lambda v: {"path": "/api/v1/batches",
                                                               "json": {"image_ids": [b.images[1], v]}}, "mixed with B's")
    yield Case("POST", "/api/v1/search/visual", "image", lambda v: {"path": "/api/v1/search/visual",
                                                                     "json": {"image_id": v}})
    # A's cursors: another scope's keyset is no cursor of B's (a forged one is the same miss)
    yield Case("GET", "/api/v1/images", "cursor:images", lambda v: {"path": "/api/v1/images", "query_string": {"cursor": v}})
    yield Case("GET", "/api/v1/jobs", "cursor:jobs", lambda v: {"path": "/api/v1/jobs", "query_string": {"cursor": v}})
    yield Case("GET", "/", "cursor:library", lambda v: {"path": "/", "query_string": {"older": v}})


#: Rules and methods without an id anywhere: B's answer must hold nothing of A's (checked for
#: every response), and these views are checked for content below.
NO_ID = {
    ("/api/docs", "GET"), ("/api/docs/static/<path:filename>", "GET"),
    ("/api/docs/swagger-ui/<name>", "GET"), ("/api/openapi.json", "GET"), ("/api/v1/events", "GET"),
    ("/api/v1/images", "POST"), ("/api/v1/search/serving", "GET"), ("/api/v1/search/serving/cutover", "POST"),
    ("/api/v1/search/serving/resume", "POST"), ("/api/v1/search/serving/rollback", "POST"),
    ("/api/v1/search/text", "GET"), ("/api/v1/webhooks", "GET"), ("/api/v1/webhooks", "POST"), ("/healthz", "GET"),
    ("/library/static/<path:filename>", "GET"), ("/login", "GET"), ("/login", "POST"), ("/logout", "POST"),
    ("/metrics", "GET"), ("/ops", "GET"), ("/ops/", "GET"), ("/ops/static/<path:filename>", "GET"),
    ("/readyz", "GET"), ("/static/<path:filename>", "GET"),
}


# --- running and comparing ---------------------------------------------------------------------

_VOLATILE = {"Date", "Set-Cookie", "Content-Length"}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


def _normalise(s: str, ids: list[str]) -> str:
    for ident in ids:
        s = s.replace(ident, "<ID>").replace(ident.replace("-", ""), "<ID>")
    return s


def _call(client, who: Tenant, kw: dict[str, Any]) -> Any:
    kw = dict(kw)
    path, method = kw.pop("path"), kw.pop("method")
    headers = {**who.headers, **kw.pop("headers", {})}
    if kw.pop("ops_form", False):  # the page's own form: its CSRF token and Origin
        html = client.get("/login").get_data(as_text=True)  # (a double-submit token: any page's will do)
        kw["data"] = {"csrf_token": page_csrf_token(html)}
        headers["Origin"] = SAME_ORIGIN
    if "data" in kw and isinstance(kw["data"], dict):  # fresh file objects for each call
        kw["data"] = {k: (io.BytesIO(v[0].getvalue()), v[1]) if isinstance(v, tuple) else v for k, v in kw["data"].items()}
    return client.open(path, method=method, headers=headers, **kw)


def _answer(resp, ids: list[str]) -> Answer:
    headers = {k: _normalise(v, ids) for k, v in resp.headers.items() if k not in _VOLATILE}
    return Answer(resp.status_code, headers, _normalise(resp.get_data(as_text=True), ids))


def _leaks(resp, owner: Tenant) -> list[str]:
    blob = resp.get_data(as_text=True) + "\n" + "\n".join(f"{k}: {v}" for k, v in resp.headers.items())
    return sorted(m for m in owner.markers if m in blob)


# --- the test ----------------------------------------------------------------------------------


def test_no_route_tells_one_scope_anything_of_another(settings, engine, publisher, store):
    s = _settings(settings)
    orch = Orchestrator(engine, s)
    app = create_app(scope_resolver=TokenScopeResolver(engine), settings=s, orchestrator=orch, engine=engine,
                     publisher=publisher, store=store, cursor_secret_key="test-secret")
    client = app.test_client()
    tenants = {}
    for scope in (A, B):
        create_scope(engine, scope)
        _, token = create_token(engine, scope, f"{scope}-key")
        tenants[scope] = Tenant(scope, {"Authorization": f"Bearer {token}"})
    a, b = tenants[A], tenants[B]
    receiver = Receiver().start()
    try:
        with Workers(orch, publisher, n=2):
            _populate(client, orch, publisher, a, receiver, 60, A_TEXT)
            _populate(client, orch, publisher, b, receiver, 160, B_TEXT)
        ops_before = _ops_figures(client, b)
        # more of A's: a queued job whose task no worker took (active: cancel/retry would act on it),
        # the sweep re-hinting it, a claim of it and a stale worker's fenced-out heartbeat
        for i, name in enumerate(("alpha queued", "alpha claimed")):
            body = _ok(upload(client, png_bytes((5, 250, 5 + i), size=(26, 26)), headers=a.headers, display_name=name), 201)
            a.images.append(body["image"]["id"])
            a.shas.append(body["image"]["sha256"])
        _activity_of_a(orch, body["job"])
        assert _ops_figures(client, b) == ops_before, "B's /ops shows A's activity"
        for t in (a, b):
            _collect(client, engine, t)
        assert not a.markers & b.markers
        _deliver_webhooks(orch, receiver, a, b)
        _check_views_of_b(client, a, b)
        _check_events_of_b(client, a, b)
        _check_id_positions(app, client, engine, store, a, b)  # (last: B uploads copies of A's bytes there)
    finally:
        receiver.stop()


def _activity_of_a(orch, job: dict) -> None:
    """A's lane work that scope-blind counters would count: queued work, a re-hint by the sweep,
    a running claim and a fencing rejection."""
    task_id = next(st["task_id"] for st in job["stages"] if st["stage"] == "visual")
    poll_until(lambda: orch.sweep().counts.get("rehinted", 0) > 0, interval=0.1, what="a re-hint of A's task")
    claim = poll_until(lambda: orch.claim_task(task_id, "alpha-worker", "visual"), what="a claim of A's task")
    assert orch.heartbeat(dataclasses.replace(claim, owner="stale-alpha-worker")) is False  # fenced out


def _ops_figures(client, t: Tenant) -> dict[str, Any]:
    """What /ops shows a scope about the lanes and the last hour: every number, flag and alarm."""
    html = _ok_html(client.get("/ops", headers=t.headers))
    lanes = {lane: {**page_lane(html, lane), "unserved": f'<tr data-lane="{lane}" class="unserved"' in html}
             for lane in ("visual", "agent", "embedding")}
    for row in lanes.values():
        row.pop("oldest")  # (the scope's own oldest wait: its own work, and a clock)
    events = {name: page_event(html, name) for name in ("fencing_rejection", "rehint")}
    return {"lanes": lanes, "events": events, "alarms": sorted(re.findall(r'data-reason="lane_unserved">([^<]*)<', html))}


def _ok_html(resp) -> str:
    assert resp.status_code == 200, resp.status_code
    return resp.get_data(as_text=True)


def _deliver_webhooks(orch, receiver: Receiver, a: Tenant, b: Tenant) -> None:
    """Run the webhook lane until each scope's receiver has every event of its scope; B's carries none of A's."""
    def step() -> bool:
        for hint in orch.webhook_hints():
            for h in deliver_subscription(orch, hint.task_id, "test-worker"):
                deliver_subscription(orch, h.task_id, "test-worker")
        got = {t.scope: {r.event["id"] for r in receiver.at(f"/ok/{t.scope}-hook")} for t in (a, b)}
        return all(set(t.event_ids) <= got[t.scope] for t in (a, b))

    poll_until(step, timeout=60, interval=0.01, what="webhook deliveries of both scopes")
    to_b = receiver.at(f"/ok/{B}-hook")
    assert {r.event["scope_id"] for r in to_b} == {B}
    assert not {r.event["id"] for r in to_b} & set(a.event_ids)
    for r in to_b:
        assert not [m for m in a.markers if m in r.body.decode()], r.body[:300]


def _ids_of(t: Tenant, kind: str) -> list[str]:
    if kind == "image+sha":
        return [f"{i}+{sha}" for i, sha in zip(t.images, t.shas, strict=True)]
    if kind.startswith("cursor:"):
        return [t.cursors[kind.split(":")[1]]]
    return {"image": t.images, "job": t.jobs, "task": t.tasks, "batch": t.batches, "webhook": t.webhooks}[kind]


def _random_of(kind: str, other: Tenant) -> str:
    if kind == "image+sha":
        return f"{uuid.uuid4()}+{os.urandom(32).hex()}"
    if kind.startswith("cursor:"):  # a cursor no scope was given: its signature does not hold
        cur = other.cursors[kind.split(":")[1]]
        return cur[:-4] + ("AAAA" if not cur.endswith("AAAA") else "BBBB")
    return str(uuid.uuid4())


def _check_id_positions(app, client, engine, store, a: Tenant, b: Tenant) -> None:
    cases = list(_id_cases(a, b))
    kinds = {c.rule: c.kind for c in cases if "<uuid:" in c.rule and c.kind in ("image", "job", "task", "batch", "webhook")}
    cases += [Case("OPTIONS", rule, kind, lambda v, r=rule: {"path": _path(r, v)}) for rule, kind in kinds.items()]
    rules = {(r.rule, m) for r in app.url_map.iter_rules() for m in r.methods}
    covered = {(c.rule, c.method) for c in cases} | NO_ID
    # HEAD is the GET's view, OPTIONS none: a rule's other cases cover them
    missing = {(r, m) for r, m in rules if (r, m) not in covered
               and not (m in ("HEAD", "OPTIONS") and any(r == rr for rr, _ in covered))}
    assert not missing, f"routes without a scope-isolation case: {sorted(missing)}"
    assert not covered - rules, f"cases for routes that no longer exist: {sorted(covered - rules)}"

    tables = _scoped_tables(engine.connect().execution_options(isolation_level="AUTOCOMMIT"))
    rows_before = _rows_of(engine, A, tables)
    with engine.connect() as conn:
        ns_a = str(conn.execute(text("SELECT storage_namespace FROM scopes WHERE id = :s"), {"s": A}).scalar_one())
    files_before = _files_of(store.root, {ns_a})
    failures: list[str] = []
    for case in cases:
        for ident in _ids_of(a, case.kind):
            rand = _random_of(case.kind, a)
            kw_a, kw_r = {**case.build(ident), "method": case.method}, {**case.build(rand), "method": case.method}
            ids = [*ident.split("+"), *rand.split("+")] if "+" in ident else [ident, rand]
            got_r = _call(client, b, kw_r)
            got_a = _call(client, b, kw_a)
            ans_a, ans_r = _answer(got_a, ids), _answer(got_r, ids)
            label = f"{case.method} {case.rule} [{case.what or case.kind}] with A's {ident[:40]}"
            if ans_a != ans_r:
                failures.append(f"{label}: {ans_a.status} {ans_a.body[:160]!r} {ans_a.headers.get('ETag')}"
                                f" vs a random id: {ans_r.status} {ans_r.body[:160]!r}")
            if leaked := [m for m in _leaks(got_a, a) if m not in ident and m.replace("-", "") not in ident.replace("-", "")]:
                # (an id B sent may be echoed back in its own 404, as a random one is)
                failures.append(f"{label}: B's answer holds A's {leaked[:4]}")
    failures += _writes_without_ids(client, a, b)
    assert not failures, f"{len(failures)} isolation failures:\n" + "\n".join(failures[:40])
    assert _rows_of(engine, A, tables) == rows_before, "a request of B's changed A's rows"
    assert _files_of(store.root, {ns_a}) == files_before, "a request of B's changed A's files"


def _writes_without_ids(client, a: Tenant, b: Tenant) -> list[str]:
    """B's writes that take no id (serving switches, a webhook, uploads of A's exact bytes): they act
    on B alone (A's rows are compared after), and identical bytes in another scope are a new image."""
    out = []
    for path in ("/api/v1/search/serving/cutover", "/api/v1/search/serving/rollback", "/api/v1/search/serving/resume"):
        for kind in ("text", "visual"):
            resp = client.post(path, query_string={"kind": kind}, headers=b.headers)
            if resp.status_code >= 500 or _leaks(resp, a):
                out.append(f"POST {path}?kind={kind}: {resp.status_code} {_leaks(resp, a)[:4]}")
    resp = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/beta-second"}, headers=b.headers)
    if resp.status_code != 201 or _leaks(resp, a):
        out.append(f"POST /api/v1/webhooks: {resp.status_code} {_leaks(resp, a)[:4]}")
    # A's bytes as the new content of one of B's images: a replace like any other (no 409 duplicate_image)
    resp = client.put(f"/api/v1/images/{b.images[2]}/content", headers=b.headers, **_png_form(a.bytes_[2]))
    if resp.status_code != 200 or [m for m in _leaks(resp, a) if m != a.shas[2]]:
        out.append(f"PUT content of B's image with A's bytes: {resp.status_code} {resp.get_data(as_text=True)[:200]}")
    for data in a.bytes_[:2]:
        resp = upload(client, data, headers=b.headers, process=False)
        body = resp.get_json() or {}
        leaked = [m for m in _leaks(resp, a) if m != hashlib.sha256(data).hexdigest()]  # its own bytes' sha256
        if resp.status_code != 201 or not body.get("created") or leaked:
            out.append(f"POST /api/v1/images with A's bytes: {resp.status_code} {str(body)[:200]} {leaked[:4]}")
    return out


def _check_views_of_b(client, a: Tenant, b: Tenant) -> None:
    """B's lists, searches, /ops (by token and by a signed-in session), library, serving, docs,
    health and metrics hold nothing of A's."""
    statics = _static_names(client.application)
    gets = ["/api/v1/images?limit=100", "/api/v1/jobs?limit=100", "/api/v1/webhooks", "/api/v1/events?limit=100",
            "/api/v1/search/serving?kind=text", "/api/v1/search/serving?kind=visual", "/ops", "/ops/", "/",
            "/healthz", "/readyz", "/metrics", "/api/openapi.json", "/api/docs", "/login",
            f"/api/docs/static/{statics['api_docs.static']}", f"/library/static/{statics['library.static']}",
            f"/ops/static/{statics['ops.static']}",
            f"/api/docs/swagger-ui/{statics.get('api_docs.swagger_ui_asset', 'swagger-ui.css')}"]
    if "static" in statics:
        gets.append(f"/static/{statics['static']}")
    # A's exact text, each word, a one-letter misreading (the near-term match reads candidates' texts), a sha256
    for q in [A_TEXT, *A_TEXT.split(), "zebracorm alphasecrets", "alpha", "alpha 0", a.shas[0]]:
        for mode in ("hybrid", "lexical", "semantic"):
            gets.append("/api/v1/search/text?" + _qs({"q": q, "mode": mode, "limit": 100}))
    leaks = []
    for path in gets:
        resp = client.get(path, headers=b.headers)
        try:
            assert resp.status_code < 500, (path, resp.status_code)
            found = _leaks(resp, a)
            if path.startswith("/api/v1/search/text"):  # the answer echoes the query: its hits must hold nothing of A's
                items = _ok(resp)["items"]
                found = sorted(m for m in a.markers if m in json.dumps(items))
            if found:
                leaks.append(f"GET {path}: {found[:4]}")
        finally:
            resp.close()  # a static file stays open otherwise
    # B's own data is there (the views are not empty by accident)
    listed = {i["id"] for i in _ok(client.get("/api/v1/images?limit=100", headers=b.headers))["items"]}
    assert listed >= set(b.images) and not listed & set(a.images)
    hits = _ok(client.get("/api/v1/search/text", query_string={"q": B_TEXT, "mode": "lexical"}, headers=b.headers))
    assert {h["image"]["id"] for h in hits["items"]} & set(b.images)
    own = _ok(client.get("/api/v1/search/text", query_string={"q": A_TEXT, "mode": "lexical"}, headers=a.headers))
    assert {h["image"]["id"] for h in own["items"]} & set(a.images)  # A's text does match, in A
    # look-alike search in B with A's exact bytes, and upload of A's exact bytes into B
    for data in a.bytes_:
        resp = client.post("/api/v1/search/visual", headers=b.headers, **_png_form(data))
        assert not {h["image"]["id"] for h in _ok(resp)["items"]} & set(a.images)
        if found := _leaks(resp, a):
            leaks.append(f"POST /api/v1/search/visual (A's bytes): {found[:4]}")
    # a signed-in browser session of B's: /ops, the library, the API through the page's session
    page = client.get("/login").get_data(as_text=True)
    token = b.headers["Authorization"].split()[1]
    signed = client.post("/login", data={"token": token, "csrf_token": page_csrf_token(page), "next": "/ops"},
                         headers={"Origin": SAME_ORIGIN})
    assert signed.status_code == 303, signed.get_data(as_text=True)[:300]
    for path in ("/ops", "/", f"/ops/images/{a.images[0]}", f"/library/images/{a.images[0]}",
                 f"/ops/images/{a.images[0]}/content"):
        resp = client.get(path, headers={"Sec-Fetch-Site": "same-origin", "Origin": SAME_ORIGIN})
        assert resp.status_code in (200, 404), (path, resp.status_code)
        if found := _leaks(resp, a):
            leaks.append(f"session GET {path}: {found[:4]}")
    html = client.get("/ops").get_data(as_text=True)
    assert all(i not in html for i in a.images) and any(i in html for i in b.images), html[:3000]
    resp = client.get("/api/v1/images?limit=100", headers={"Sec-Fetch-Site": "same-origin", "Origin": SAME_ORIGIN})
    assert {i["id"] for i in _ok(resp)["items"]} == listed
    client.post("/logout", data={"csrf_token": page_csrf_token(client.get("/ops/images/" + b.images[0]).get_data(as_text=True))},
                headers={"Origin": SAME_ORIGIN})
    assert not leaks, "\n".join(leaks)


def _qs(params: dict[str, Any]) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def _check_events_of_b(client, a: Tenant, b: Tenant) -> None:
    """B's events — JSON, long-poll and SSE, from 0 and from each of A's event ids (``after`` or
    ``Last-Event-ID``) — are B's and only B's."""
    own = sorted(b.event_ids)
    for after in [0, *a.event_ids]:
        for kw in ({"query_string": {"after": after, "limit": 100}},
                   {"query_string": {"after": after, "limit": 100, "wait": 0.01}}):
            body = _ok(client.get("/api/v1/events", headers=b.headers, **kw))
            assert [e["id"] for e in body["events"]] == [i for i in own if i > after], (after, body)
            assert body["expired"] is None and {e["scope_id"] for e in body["events"]} <= {B}
        resp = client.get("/api/v1/events", headers={**b.headers, "Accept": "text/event-stream",
                                                     "Last-Event-ID": str(after)})
        stream = resp.get_data(as_text=True)
        sent = [int(m) for m in re.findall(r"^id: (\d+)$", stream, re.MULTILINE)]
        assert sent == [i for i in own if i > after][:len(sent)] and not set(sent) & set(a.event_ids)
        assert not [m for m in a.markers if m in stream]
