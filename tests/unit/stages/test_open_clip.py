"""open_clip visual provider: its own venv runs its tests; this venv must explain how to get it.

open_clip needs torchvision, which does not import beside this venv's torch 2.13.0+cpu, so the
provider's tests (tests/openclip, a tiny random model saved and loaded through the real loading
code) run under .venv-openclip, built by `make install-openclip` (and by `make test`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.stages import registry

ROOT = Path(__file__).resolve().parents[3]
OPENCLIP_PYTHON = Path(os.environ.get("MEMEFLOW_OPENCLIP_PYTHON", ROOT / ".venv-openclip" / "bin" / "python"))


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


def test_without_open_clip_the_provider_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "open_clip", None)  # as in the main venv, whichever venv runs this
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(ValueError, match=r"`openclip` extra.*make install-openclip.*\.venv-openclip"):
        registry.get_visual_provider("open_clip", checkpoint_path=str(checkpoint), model_name="ViT-B-32")


def test_open_clip_provider_suite_passes_in_its_own_venv():
    if not OPENCLIP_PYTHON.is_file():
        pytest.fail(
            f"{OPENCLIP_PYTHON} not found: the open_clip provider's tests need its venv; run `make install-openclip`",
            pytrace=False,
        )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",  # a tiny model: one thread is plenty, and the suite shares the CPU
    }
    # --confcutdir keeps tests/conftest.py (embedded PostgreSQL/Redis, collect_ignore) out of the child.
    command = [str(OPENCLIP_PYTHON), "-m", "pytest", "-q", "--confcutdir=tests/openclip", "tests/openclip"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout}\n{proc.stderr}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout
