"""`memeflow up`'s supervisor: every part starts, Flower sees the workers, an upload flows, and
stop() leaves no process behind."""

from __future__ import annotations

import io
import json
import socket

import pytest
import requests
from PIL import Image

from app.cli.stack import Stack
from app.embedded import _pid_alive
from tests.conftest import poll_until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stack_starts_everything_serves_an_upload_and_stops_cleanly(it_settings):
    settings = it_settings.replace(api_port=_free_port(), flower_port=_free_port(), log_json=True)
    stack = Stack(settings, echo=lambda *a, **k: None, start_timeout_s=90)
    stack.start()
    pids = []
    try:
        pids = [c.proc.pid for c in stack.children]
        assert {c.name for c in stack.children} == set(Stack.DEFAULT)  # SPEC §7: no maintenance worker
        flower = f"http://127.0.0.1:{settings.flower_port}/workers?json=1"

        def online():
            data = requests.get(flower, timeout=5).json()["data"]
            return sorted(w["hostname"].split("@")[0] for w in data if w.get("status"))

        assert poll_until(lambda: online() == ["agent", "embedding", "visual", "webhooks"] and online(),
                          timeout=30, interval=0.5, what="Flower shows the lane and webhooks workers online")
        buf = io.BytesIO()
        Image.new("RGB", (20, 20), (1, 2, 3)).save(buf, format="PNG")
        api = f"http://127.0.0.1:{settings.api_port}/api/v1"
        resp = requests.post(f"{api}/images", files={"file": ("a.png", buf.getvalue(), "image/png")}, timeout=10)
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["job"]["id"]
        job = poll_until(
            lambda: (j := requests.get(f"{api}/jobs/{job_id}", timeout=5).json())["status"] == "succeeded" and j,
            timeout=60, interval=0.2, what="the uploaded image's job",
        )
        assert [s["status"] for s in job["stages"]] == ["succeeded"] * 3
        # the job's event through gunicorn's threaded workers, as Server-Sent Events
        with requests.get(f"{api}/events?after=0", headers={"Accept": "text/event-stream"}, stream=True,
                          timeout=30) as sse:
            assert sse.headers["Content-Type"].startswith("text/event-stream")
            data = next(line for line in sse.iter_lines(decode_unicode=True) if line.startswith("data: "))
        assert json.loads(data[6:])["job_id"] == job_id

        # workers start with task events off (MEMEFLOW_WORKER_TASK_EVENTS=false); Flower switches
        # them on while it runs, so its task views fill once it has been up for a moment
        datatable = (f"http://127.0.0.1:{settings.flower_port}/tasks/datatable?draw=1&start=0&length=50"
                     "&order[0][column]=0&columns[0][data]=name&order[0][dir]=asc")

        uploads = iter(range(4, 200))

        def flower_task_names():
            buf2 = io.BytesIO()  # new bytes each time: a re-upload of the same bytes runs nothing
            Image.new("RGB", (20, 20), (next(uploads), 5, 6)).save(buf2, format="PNG")
            requests.post(f"{api}/images", files={"file": ("b.png", buf2.getvalue(), "image/png")}, timeout=10)
            names = {t["name"] for t in requests.get(datatable, timeout=5).json()["data"]}
            return names >= {"memeflow.run_visual", "memeflow.run_agent", "memeflow.run_embedding"}

        assert poll_until(flower_task_names, timeout=60, interval=2.0, what="Flower sees task events")
    finally:
        stack.stop()
    assert not [pid for pid in pids if _pid_alive(pid)]
