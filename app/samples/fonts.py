"""Locate the system fonts the sample generator draws with (Debian packages, see scripts/system-deps.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# (fontconfig pattern, known paths, Debian package) per script.
_FONTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "latin": (
        "DejaVu Sans:style=Bold",
        (
            "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans-Bold.ttf",
        ),
        "fonts-dejavu-core",
    ),
    "cjk": (
        "WenQuanYi Micro Hei",
        (
            "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
            "/usr/share/fonts/wqy-microhei/wqy-microhei.ttc",
        ),
        "fonts-wqy-microhei",
    ),
}


class FontNotFound(RuntimeError):
    """A font the sample generator needs is not installed."""


def find_font(kind: str) -> Path:
    """Path of the font for ``kind`` ("latin" or "cjk"), from known paths or ``fc-match``."""
    pattern, paths, package = _FONTS[kind]
    for candidate in paths:
        if Path(candidate).is_file():
            return Path(candidate)
    if shutil.which("fc-match"):
        out = subprocess.run(
            ["fc-match", "-f", "%{file}", pattern], capture_output=True, text=True, check=False
        ).stdout.strip()
        # fc-match always answers something; accept it only if it is the family we asked for.
        hint = {"latin": "dejavusans", "cjk": "wqy"}[kind]
        if out and Path(out).is_file() and hint in Path(out).name.lower().replace("-", ""):
            return Path(out)
    raise FontNotFound(
        f"font {pattern!r} not found: install the Debian package {package} "
        f"(`sudo apt-get install {package}` or `bash scripts/system-deps.sh`)"
    )
