"""Every ``MEMEFLOW_*`` setting of app/config.py is named, in full, in README.md or docs/*.md
(the measurement logs aside), and a README configuration row that names one setting and a plain
number as its default states the setting's true default (a setting whose default is ``None`` is
computed from others, and skipped)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from app.config import Settings

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"MEMEFLOW_[A-Z0-9_]*[A-Z0-9]")


def _docs_text() -> str:
    pages = [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if not p.stem.endswith("-log")]
    return "\n".join(p.read_text() for p in pages)


def test_every_setting_is_documented_by_its_full_name():
    named = set(NAME.findall(_docs_text()))
    missing = sorted(n for f in dataclasses.fields(Settings) if (n := f"MEMEFLOW_{f.name.upper()}") not in named)
    assert not missing, f"settings of app/config.py named nowhere in README.md or docs/*.md: {missing}"


def test_readme_numeric_defaults_are_the_settings_defaults():
    defaults = {f"MEMEFLOW_{f.name.upper()}": f.default for f in dataclasses.fields(Settings)}
    wrong, checked = [], 0
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.startswith("| `MEMEFLOW_"):
            continue
        names = NAME.findall(cells[0])
        values = [v.strip() for v in re.split(r",\s(?=\S)", cells[1].split("(")[0].strip())]
        if len(names) != len(values) or not all(re.fullmatch(r"[\d,]+(\.\d+)?", v) for v in values):
            continue  # not a plain "one number per setting" row
        for name, value in zip(names, values, strict=True):
            if defaults.get(name) is None:
                continue  # unknown here, or computed from other settings (its docs say how)
            checked += 1
            if float(value.replace(",", "")) != float(defaults[name]):
                wrong.append((name, value, defaults[name]))
    assert checked >= 20, f"only {checked} README rows were read: has the table's layout changed?"
    assert not wrong, f"README.md states defaults that are not app/config.py's: {wrong}"
