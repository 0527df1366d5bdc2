"""Read numbers back out of the rendered /ops page, and the truth straight from the database."""

from __future__ import annotations

import re

from sqlalchemy import text

from tests.ops.conftest import SCOPE


def page_job_counts(html: str) -> dict[str, int]:
    return {s: int(n) for s, n in re.findall(r'data-status="(\w+)"><div class="v" data-count="(\d+)"', html)}


def page_lane(html: str, lane: str) -> dict[str, str]:
    row = re.search(rf'<tr data-lane="{lane}"[^>]*>(.*?)</tr>', html, re.DOTALL)
    assert row, f"lane {lane} missing from the page"
    return {k: v.strip() for k, v in re.findall(r'data-k="(\w+)">([^<]*)<', row.group(1))}


def page_funnel(html: str, stage: str) -> dict[str, int]:
    row = re.search(rf'<tr data-stage="{stage}">(.*?)</tr>', html, re.DOTALL)
    assert row, f"stage {stage} missing from the funnel"
    return {k: int(v) for k, v in re.findall(r'data-k="(\w+)">(\d+)<', row.group(1))}


def page_event(html: str, name: str) -> int:
    m = re.search(rf'data-event="{name}"><div class="v">(\d+)<', html)
    assert m, f"event {name} missing"
    return int(m.group(1))


def db_job_counts(engine, scope: str = SCOPE) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.status: r.n for r in conn.execute(
            text("SELECT status, count(*) AS n FROM processing_jobs WHERE scope_id = :s GROUP BY status"), {"s": scope})}


def db_lane(engine, lane: str, scope: str = SCOPE) -> dict[str, int]:
    with engine.connect() as conn:
        r = conn.execute(text("""
            SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
                   count(*) FILTER (WHERE status = 'running') AS running
              FROM tasks WHERE scope_id = :s AND lane = :l"""), {"s": scope, "l": lane}).one()
        return {"queued": r.queued, "running": r.running}


def db_funnel(engine, stage: str, scope: str = SCOPE) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.status: r.n for r in conn.execute(text(
            "SELECT status, count(*) AS n FROM job_stages WHERE scope_id = :s AND stage = :st GROUP BY status"),
            {"s": scope, "st": stage})}


SAME_ORIGIN = "http://localhost"  # the Flask test client's origin


def page_csrf_token(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def same_site_post(client, url: str, *, page: str = "/ops", headers: dict | None = None, data: dict | None = None):
    """POST as the page's own form would: its CSRF token (from a GET of ``page``) and its Origin."""
    html = client.get(page, headers=headers or {}).get_data(as_text=True)
    form = {"csrf_token": page_csrf_token(html), **(data or {})}
    return client.post(url, data=form, headers={"Origin": SAME_ORIGIN, **(headers or {})})
