"""/ops renders the database truth for the request's scope, and its retry button calls the orchestrator."""

from __future__ import annotations

import re
import uuid
from typing import ClassVar

import pytest
from flask import Flask
from sqlalchemy import text

from app.auth import hash_token
from app.ops import register_ops
from tests.ops.conftest import OTHER, SCOPE
from tests.ops.helpers import (
    db_funnel,
    db_job_counts,
    db_lane,
    page_event,
    page_funnel,
    page_job_counts,
    page_lane,
    same_site_post,
)


def test_jobs_by_status_match_the_database(ops_app, engine, seeded):
    html = ops_app.test_client().get("/ops").get_data(as_text=True)
    shown = page_job_counts(html)
    truth = db_job_counts(engine)
    assert truth == {"succeeded": 4, "queued": 2, "running": 3, "failed": 2, "blocked": 1, "unknown_execution": 2}
    assert {k: v for k, v in shown.items() if v} == truth
    assert shown["cancelled"] == 0  # every status is listed, even when empty
    assert '<meta http-equiv="refresh" content="5">' in html


def test_lanes_and_funnel_match_the_database(ops_app, engine, seeded):
    html = ops_app.test_client().get("/ops/").get_data(as_text=True)
    for lane in ("visual", "agent", "embedding"):
        row, truth = page_lane(html, lane), db_lane(engine, lane)
        assert int(row["queued"]) == truth["queued"], lane
        assert int(row["running"]) == truth["running"], lane
    assert db_lane(engine, "agent")["running"] == 2
    # agent slots: 2 held by this scope of the limit 4 (the other tenant's third is not shown)
    assert page_lane(html, "agent")["slots"] == "2 / 4"
    assert page_lane(html, "visual")["slots"].endswith("/ ∞")
    oldest = page_lane(html, "visual")["oldest"]
    minutes, seconds = (int(x.rstrip("ms")) for x in oldest.split())
    assert 90 <= minutes * 60 + seconds < 180, oldest  # seeded 90 s ago
    for stage in ("visual", "agent", "text_embedding"):
        shown = {k: v for k, v in page_funnel(html, stage).items() if v}
        assert shown == db_funnel(engine, stage), stage


def test_events_last_hour_sum_only_recent_buckets(ops_app, seeded):
    html = ops_app.test_client().get("/ops").get_data(as_text=True)
    assert page_event(html, "fencing_rejection") == 3
    assert page_event(html, "rehint") == 7


def test_needs_human_lists_latest_failures_with_codes_and_retry_buttons(ops_app, seeded):
    html = ops_app.test_client().get("/ops").get_data(as_text=True)
    section = html.split('id="needs-human"')[1].split("</section>")[0]
    waiting = seeded.jobs["unknown_execution"] + seeded.jobs["blocked"] + seeded.jobs["failed"]
    for job_id in waiting:
        assert f'data-job="{job_id}"' in section
        assert f'action="/ops/jobs/{job_id}/retry"' in section
    assert section.count("data-job=") == len(waiting)  # the retried-later failure is not listed
    assert "operation_limit_exceeded" in section and "daily agent quota reached" in section
    assert "invalid_image" in section and "agent_timeout" not in section
    # unknown_execution first
    assert section.index(str(seeded.jobs["unknown_execution"][0])) < section.index(str(seeded.jobs["blocked"][0]))


def test_other_scopes_are_invisible(ops_app, engine, seeded):
    html = ops_app.test_client().get("/ops").get_data(as_text=True)
    assert db_job_counts(engine, OTHER)["unknown_execution"] == 5
    assert page_job_counts(html)["unknown_execution"] == 2
    assert "other-" not in html
    with engine.connect() as conn:
        other_image = conn.execute(text("SELECT id FROM images WHERE scope_id = :s LIMIT 1"), {"s": OTHER}).scalar()
    assert ops_app.test_client().get(f"/ops/images/{other_image}").status_code == 404


def test_batch_progress(ops_app, seeded):
    html = ops_app.test_client().get("/ops").get_data(as_text=True)
    row = html.split(f'data-batch="{seeded.batch_id}"')[1].split("</tr>")[0]
    assert "3 / 4" in row  # items: 3 succeeded, 1 queued
    assert '<rect class="b-ok" x="0" y="0" width="75.0"' in row


def test_image_page_shows_thumbnail_context_and_timeline(ops_app, seeded):
    image_id = seeded.images["running-6"]
    resp = ops_app.test_client().get(f"/ops/images/{image_id}")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)
    assert f'src="/ops/images/{image_id}/content"' in html
    assert "&#34;ocr_text&#34;: &#34;RUNNING-6&#34;" in html or '"ocr_text": "RUNNING-6"' in html
    for stage in ("visual", "agent", "text_embedding"):
        assert f'<tr data-stage="{stage}">' in html
    timeline = html.split('id="tasks"')[1].split("</table>")[0]
    assert timeline.count("<tr>") == 3  # header + visual (succeeded) + agent (running)
    assert timeline.count('class="chip s-succeeded"') == 1 and timeline.count('class="chip s-running"') == 1
    assert ops_app.test_client().get(f"/ops/images/{uuid.uuid4()}").status_code == 404


def test_retry_button_posts_to_the_orchestrator_with_the_request_scope(ops_app, seeded, retry_recorder):
    job_id = seeded.jobs["unknown_execution"][0]
    browser = ops_app.test_client()
    resp = same_site_post(browser, f"/ops/jobs/{job_id}/retry")
    assert resp.status_code == 303
    assert retry_recorder.calls == [(SCOPE, job_id)]
    follow = browser.get(resp.headers["Location"]).get_data(as_text=True)  # the notice: this browser's
    assert "new job new-job-id" in follow
    # GET never retries
    assert ops_app.test_client().get(f"/ops/jobs/{job_id}/retry").status_code == 405
    assert len(retry_recorder.calls) == 1


def test_retry_refusal_is_shown_not_raised(engine, seeded):
    class JobNotRetryable(Exception):
        code, status = "job_not_retryable", 409

    def refuse(scope_id, job_id):
        raise JobNotRetryable("job is not in a retryable state")

    app = Flask("ops-refuse")
    register_ops(app, engine=engine, scope_for_request=lambda: SCOPE, retry_job=refuse)
    client = app.test_client()
    resp = same_site_post(client, f"/ops/jobs/{seeded.jobs['succeeded'][0]}/retry")
    assert resp.status_code == 303
    assert "job_not_retryable" in client.get(resp.headers["Location"]).get_data(as_text=True)


def test_defaults_use_the_api_services_and_fail_closed(engine, seeded):
    """Wired like the API factory does: extensions["memeflow"] with engine, resolver, orchestrator."""

    class Unauthorized(Exception):
        code, status = "unauthorized", 401

    class Resolver:
        def resolve(self, headers):
            if headers.get("Authorization") != "Bearer good":
                raise Unauthorized("missing or invalid token")
            return SCOPE

    class Orchestrator:
        calls: ClassVar[list] = []
        counted: ClassVar[list] = []

        def take_request(self, kind, scope_id, key):  # the processing rate limit's window
            self.counted.append((kind, scope_id, key))

        def retry_job(self, scope_id, job_id):
            self.calls.append((scope_id, job_id))
            return type("R", (), {"job": {"id": "j2"}, "hints": ["hint"]})()

    class Publisher:
        published: ClassVar[list] = []

        def publish(self, hints):
            self.published.extend(hints)

    class Settings:
        auth = "token"
        agent_lane_limit = 2
        sweep_interval_s = 15.0
        worker_registry_interval_s = 10.0

    svc = type("Services", (), {"engine": engine, "scope_resolver": Resolver(), "orchestrator": Orchestrator(),
                                "publisher": Publisher(), "settings": Settings()})()
    app = Flask("ops-default")
    app.extensions["memeflow"] = svc
    register_ops(app)
    client = app.test_client()
    to_login = client.get("/ops")  # a browser without credentials is sent to the sign-in page
    assert to_login.status_code == 303 and to_login.headers["Location"].startswith("/login?next=/ops")
    denied = client.get("/ops", headers={"Authorization": "Bearer bad"})
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    assert client.post(f"/ops/jobs/{seeded.jobs['failed'][0]}/retry").status_code == 401
    assert Orchestrator.calls == []
    ok = client.get("/ops", headers={"Authorization": "Bearer good"})
    assert ok.status_code == 200
    assert page_lane(ok.get_data(as_text=True), "agent")["slots"] == "2 / 2"
    resp = same_site_post(client, f"/ops/jobs/{seeded.jobs['failed'][0]}/retry", headers={"Authorization": "Bearer good"})
    assert resp.status_code == 303
    assert Orchestrator.calls == [(SCOPE, seeded.jobs["failed"][0])]
    assert Orchestrator.counted == [("processing", SCOPE, f"token:{hash_token('good')}")]
    assert Publisher.published == ["hint"]


@pytest.mark.parametrize("path", ["/ops", "/ops/images/00000000-0000-0000-0000-000000000000", "/login",
                                  "/ops/images/00000000-0000-0000-0000-000000000000/content"])
def test_page_reads_never_write(ops_app, engine, seeded, path):
    def snapshot():
        with engine.connect() as conn:
            return conn.execute(text(
                "SELECT (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_xact_user_tables),"
                " (SELECT md5(string_agg(id::text || status || updated_at::text, ',' ORDER BY id))"
                "  FROM processing_jobs), (SELECT md5(string_agg(id::text || status, ',' ORDER BY id)) FROM tasks)"
            )).one()[1:]

    before = snapshot()
    ops_app.test_client().get(path)
    assert snapshot() == before


def test_liveness_shows_workers_per_lane_and_flags_unserved_lanes_and_a_stale_sweep(engine, seeded, settings):
    from datetime import UTC, datetime, timedelta

    from app.orchestrator.liveness import WorkerIdentity, register_worker
    from app.orchestrator.store import sweep as sweep_q
    from app.orchestrator.store import workers as workers_q

    app = Flask("ops-liveness")
    register_ops(app, engine=engine, scope_for_request=lambda: SCOPE, retry_job=lambda *a: None,
                 slot_limits={"agent": 4}, settings=settings.replace(sweep_interval_s=60.0))
    client = app.test_client()

    html = client.get("/ops").get_data(as_text=True)  # no worker, no sweep ever
    assert 'data-reason="sweep_stale"' in html and "no reconcile sweep has completed yet" in html
    assert 'id="sweep" data-stale="true"' in html
    with engine.connect() as conn:
        queued = set(conn.execute(text("SELECT DISTINCT lane FROM tasks WHERE status = 'queued' AND scope_id = :s"),
                                  {"s": SCOPE}).scalars())  # (the page flags this scope's work only)
    assert queued and queued < {"visual", "agent", "embedding"}  # the seed has lanes with and without work
    for lane in ("visual", "agent", "embedding"):
        flagged = re.search(rf'<tr data-lane="{lane}" class="unserved" data-unserved="true"', html) is not None
        assert flagged == (lane in queued), lane
        assert page_lane(html, lane)["workers"].startswith("0")
    assert html.count('data-reason="lane_unserved"') == len(queued)

    now = datetime.now(UTC)
    for node, lane in (("v@h", "visual"), ("v2@h", "visual"), ("a@h", "agent"), ("e@h", "embedding")):
        register_worker(engine, WorkerIdentity(node=node, lanes=(lane, "maintenance"), started_at=now, host="h", pid=1))
    with engine.begin() as conn:  # a sweep 200 s ago: more than 3x the 60 s interval
        sweep_q.record_sweep_txn(conn, workers_q.db_now(conn) - timedelta(seconds=200), 0.01, {})
    html = client.get("/ops").get_data(as_text=True)
    assert 'data-reason="lane_unserved"' not in html and 'class="unserved"' not in html
    assert [page_lane(html, lane)["workers"] for lane in ("visual", "agent", "embedding")] == ["2", "1", "1"]
    assert re.search(r'id="maintenance-workers"><div class="v" data-k="workers">4<', html)
    assert 'data-reason="sweep_stale"' in html and "more than 3x the 60s interval" in html

    with engine.begin() as conn:
        sweep_q.record_sweep_txn(conn, None, 0.01, {})
    html = client.get("/ops").get_data(as_text=True)
    assert "data-reason=" not in html and 'id="sweep" data-stale="false"' in html
