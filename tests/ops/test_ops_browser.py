"""/ops rendered by a real headless Chromium against a live server over a database in many states."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.ops.helpers import db_job_counts, db_lane, page_job_counts, page_lane

ROOT = Path(__file__).resolve().parents[2]


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is required: run `bash scripts/system-deps.sh` (installs the Debian package)"
    return exe


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def test_headless_chromium_renders_db_truth_and_screenshot(live_ops, engine, seeded, tmp_path):
    url = f"{live_ops}/ops"
    dom = _run_chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "memeflow · ops" in html
    for lane in ("visual", "agent", "embedding"):
        row, truth = page_lane(html, lane), db_lane(engine, lane)
        assert (int(row["queued"]), int(row["running"])) == (truth["queued"], truth["running"]), lane
    assert {k: v for k, v in page_job_counts(html).items() if v} == db_job_counts(engine)
    assert "operation_limit_exceeded" in html

    shot = tmp_path / "ops.png"
    result = _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars", url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
