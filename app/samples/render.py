"""Render the sample memes with Pillow and write them to a directory, deterministically."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from app.atomic import write_atomic
from app.samples.catalog import NEAR_DUPLICATES, SAMPLES, Sample
from app.samples.fonts import find_font

WIDTH, HEIGHT = 480, 360
_MARGIN = 14
_WHITE, _BLACK = (255, 255, 255), (0, 0, 0)

Draw = ImageDraw.ImageDraw


# ---------------------------------------------------------------- subjects (simple shapes)
def _cat(d: Draw, cx: int, cy: int) -> None:
    fur, dark = (240, 170, 80), (60, 40, 20)
    d.polygon([(cx - 58, cy - 20), (cx - 48, cy - 78), (cx - 12, cy - 45)], fill=fur, outline=dark, width=3)
    d.polygon([(cx + 58, cy - 20), (cx + 48, cy - 78), (cx + 12, cy - 45)], fill=fur, outline=dark, width=3)
    d.ellipse([cx - 62, cy - 55, cx + 62, cy + 55], fill=fur, outline=dark, width=3)
    for ex in (cx - 24, cx + 24):
        d.ellipse([ex - 10, cy - 18, ex + 10, cy + 2], fill=(90, 200, 90), outline=dark, width=2)
        d.ellipse([ex - 3, cy - 14, ex + 3, cy - 2], fill=dark)
    d.polygon([(cx - 7, cy + 10), (cx + 7, cy + 10), (cx, cy + 18)], fill=(230, 110, 130))
    for side in (-1, 1):
        for dy in (-4, 6):
            d.line([(cx + side * 14, cy + 16), (cx + side * 60, cy + 10 + dy)], fill=dark, width=2)


def _dog(d: Draw, cx: int, cy: int) -> None:
    fur, ear, dark = (200, 150, 100), (120, 80, 50), (40, 30, 20)
    d.ellipse([cx - 80, cy - 50, cx - 40, cy + 40], fill=ear, outline=dark, width=3)
    d.ellipse([cx + 40, cy - 50, cx + 80, cy + 40], fill=ear, outline=dark, width=3)
    d.ellipse([cx - 55, cy - 60, cx + 55, cy + 55], fill=fur, outline=dark, width=3)
    d.ellipse([cx - 30, cy + 5, cx + 30, cy + 50], fill=(235, 210, 170), outline=dark, width=2)
    d.ellipse([cx - 12, cy + 8, cx + 12, cy + 24], fill=dark)
    for ex in (cx - 22, cx + 22):
        d.ellipse([ex - 8, cy - 25, ex + 8, cy - 9], fill=dark)
    d.arc([cx - 14, cy + 22, cx + 14, cy + 42], 20, 160, fill=dark, width=3)


def _rocket(d: Draw, cx: int, cy: int) -> None:
    body, dark = (230, 230, 235), (40, 40, 50)
    d.polygon([(cx, cy - 80), (cx - 28, cy - 30), (cx + 28, cy - 30)], fill=(220, 50, 50), outline=dark)
    d.rectangle([cx - 28, cy - 30, cx + 28, cy + 50], fill=body, outline=dark, width=3)
    d.ellipse([cx - 14, cy - 14, cx + 14, cy + 14], fill=(90, 170, 230), outline=dark, width=3)
    d.polygon([(cx - 28, cy + 20), (cx - 55, cy + 60), (cx - 28, cy + 50)], fill=(220, 50, 50), outline=dark)
    d.polygon([(cx + 28, cy + 20), (cx + 55, cy + 60), (cx + 28, cy + 50)], fill=(220, 50, 50), outline=dark)
    d.polygon([(cx - 18, cy + 50), (cx + 18, cy + 50), (cx, cy + 85)], fill=(255, 190, 40))


def _server(d: Draw, cx: int, cy: int) -> None:
    dark = (30, 30, 35)
    d.rectangle([cx - 55, cy - 70, cx + 55, cy + 70], fill=(70, 72, 80), outline=dark, width=3)
    for i in range(4):
        y = cy - 60 + i * 33
        d.rectangle([cx - 45, y, cx + 45, y + 25], fill=(50, 52, 58), outline=dark, width=2)
        d.ellipse([cx + 28, y + 8, cx + 38, y + 18], fill=(60, 220, 90) if i % 2 == 0 else (240, 60, 60))
        d.line([(cx - 35, y + 12), (cx + 10, y + 12)], fill=(150, 150, 160), width=3)


def _computer(d: Draw, cx: int, cy: int) -> None:
    dark = (30, 30, 35)
    d.rectangle([cx - 75, cy - 60, cx + 75, cy + 35], fill=(50, 50, 55), outline=dark, width=3)
    d.rectangle([cx - 65, cy - 50, cx + 65, cy + 25], fill=(20, 30, 25))
    for i, w in enumerate((80, 55, 100, 40)):
        d.line([(cx - 55, cy - 38 + i * 16), (cx - 55 + w, cy - 38 + i * 16)], fill=(80, 230, 120), width=4)
    d.rectangle([cx - 15, cy + 35, cx + 15, cy + 55], fill=(90, 90, 95))
    d.rectangle([cx - 50, cy + 55, cx + 50, cy + 65], fill=(90, 90, 95), outline=dark)


def _coffee(d: Draw, cx: int, cy: int) -> None:
    dark = (40, 25, 15)
    d.rectangle([cx - 45, cy - 35, cx + 35, cy + 55], fill=(245, 245, 240), outline=dark, width=3)
    d.arc([cx + 15, cy - 15, cx + 65, cy + 35], -90, 90, fill=dark, width=8)
    d.rectangle([cx - 40, cy - 30, cx + 30, cy - 15], fill=(110, 60, 30))
    for x in (cx - 25, cx - 5, cx + 15):
        d.arc([x - 8, cy - 75, x + 8, cy - 45], 90, 270, fill=(235, 235, 235), width=3)


def _bug(d: Draw, cx: int, cy: int) -> None:
    dark = (20, 20, 20)
    for side in (-1, 1):
        for dy in (-25, 0, 25):
            d.line([(cx, cy + dy), (cx + side * 70, cy + dy + 15)], fill=dark, width=4)
    d.ellipse([cx - 45, cy - 50, cx + 45, cy + 60], fill=(200, 40, 40), outline=dark, width=3)
    d.line([(cx, cy - 50), (cx, cy + 60)], fill=dark, width=3)
    d.ellipse([cx - 25, cy - 75, cx + 25, cy - 35], fill=dark)
    for x, y in ((cx - 20, cy - 15), (cx + 18, cy + 10), (cx - 15, cy + 30), (cx + 20, cy - 25)):
        d.ellipse([x - 8, y - 8, x + 8, y + 8], fill=dark)


def _chart(d: Draw, cx: int, cy: int) -> None:
    d.rectangle([cx - 85, cy - 65, cx + 85, cy + 65], fill=(250, 250, 250), outline=(30, 30, 30), width=3)
    for i, h in enumerate((30, 50, 45, 80, 105)):
        x = cx - 70 + i * 30
        d.rectangle([x, cy + 55 - h, x + 20, cy + 55], fill=(60, 160, 80))
    d.line([(cx - 60, cy + 20), (cx - 30, cy), (cx, cy + 5), (cx + 30, cy - 25), (cx + 60, cy - 55)],
           fill=(220, 60, 60), width=4)


def _cloud(d: Draw, cx: int, cy: int) -> None:
    for x, y, r in ((cx - 40, cy, 35), (cx, cy - 20, 45), (cx + 40, cy, 35)):
        d.ellipse([x - r, y - r, x + r, y + r], fill=(235, 240, 245))
    d.rectangle([cx - 40, cy, cx + 40, cy + 35], fill=(235, 240, 245))
    for x in (cx - 40, cx - 10, cx + 20, cx + 45):
        d.line([(x, cy + 45), (x - 10, cy + 70)], fill=(120, 180, 255), width=4)


def _sun(d: Draw, cx: int, cy: int) -> None:
    import math

    for i in range(12):
        a = i * math.pi / 6
        d.line([(cx + 50 * math.cos(a), cy + 50 * math.sin(a)), (cx + 80 * math.cos(a), cy + 80 * math.sin(a))],
               fill=(255, 220, 60), width=6)
    d.ellipse([cx - 45, cy - 45, cx + 45, cy + 45], fill=(255, 210, 40), outline=(200, 140, 0), width=3)
    d.arc([cx - 22, cy - 5, cx + 22, cy + 25], 20, 160, fill=(120, 60, 0), width=4)


def _pizza(d: Draw, cx: int, cy: int) -> None:
    d.polygon([(cx, cy + 70), (cx - 70, cy - 55), (cx + 70, cy - 55)], fill=(250, 200, 80), outline=(150, 90, 20))
    d.rectangle([cx - 72, cy - 68, cx + 72, cy - 52], fill=(190, 120, 40))
    for x, y in ((cx - 25, cy - 30), (cx + 20, cy - 25), (cx, cy + 10), (cx - 5, cy - 40)):
        d.ellipse([x - 11, y - 11, x + 11, y + 11], fill=(200, 40, 40))


def _frog(d: Draw, cx: int, cy: int) -> None:
    green, dark = (90, 170, 70), (20, 50, 20)
    d.ellipse([cx - 75, cy - 35, cx + 75, cy + 60], fill=green, outline=dark, width=3)
    for ex in (cx - 35, cx + 35):
        d.ellipse([ex - 25, cy - 70, ex + 25, cy - 20], fill=green, outline=dark, width=3)
        d.ellipse([ex - 13, cy - 58, ex + 13, cy - 32], fill=_WHITE)
        d.ellipse([ex - 6, cy - 50, ex + 6, cy - 38], fill=dark)
    d.arc([cx - 45, cy - 5, cx + 45, cy + 35], 10, 170, fill=(160, 30, 30), width=5)


def _fish(d: Draw, cx: int, cy: int) -> None:
    dark = (20, 40, 60)
    d.polygon([(cx + 40, cy), (cx + 85, cy - 35), (cx + 85, cy + 35)], fill=(255, 140, 60), outline=dark)
    d.ellipse([cx - 75, cy - 40, cx + 55, cy + 40], fill=(255, 160, 70), outline=dark, width=3)
    d.ellipse([cx - 50, cy - 15, cx - 34, cy + 1], fill=_WHITE, outline=dark)
    d.ellipse([cx - 45, cy - 10, cx - 39, cy - 4], fill=dark)
    for x in (cx - 10, cx + 12):
        d.arc([x - 15, cy - 25, x + 15, cy + 25], -60, 60, fill=dark, width=2)


SUBJECTS: dict[str, Callable[[Draw, int, int], None]] = {
    "cat": _cat, "dog": _dog, "rocket": _rocket, "server": _server, "computer": _computer,
    "coffee": _coffee, "bug": _bug, "chart": _chart, "cloud": _cloud, "sun": _sun,
    "pizza": _pizza, "frog": _frog, "fish": _fish,
}


# ---------------------------------------------------------------- captions
def _fit_font(d: Draw, text: str, font_path: Path, max_size: int) -> ImageFont.FreeTypeFont:
    size = max_size
    while size > 14:
        font = ImageFont.truetype(str(font_path), size)
        left, _, right, _ = d.textbbox((0, 0), text, font=font, stroke_width=3)
        if right - left <= WIDTH - 2 * _MARGIN:
            return font
        size -= 2
    return ImageFont.truetype(str(font_path), size)


def _caption(d: Draw, text: str, font_path: Path, *, top: bool, max_size: int) -> None:
    if not text:
        return
    font = _fit_font(d, text, font_path, max_size)
    left, t, right, b = d.textbbox((0, 0), text, font=font, stroke_width=3)
    x = (WIDTH - (right - left)) // 2 - left
    y = _MARGIN - t if top else HEIGHT - _MARGIN - b
    d.text((x, y), text, font=font, fill=_WHITE, stroke_width=3, stroke_fill=_BLACK)


def render_sample(sample: Sample) -> Image.Image:
    """Draw one sample meme as an RGB image of WIDTH x HEIGHT."""
    img = Image.new("RGB", (WIDTH, HEIGHT), sample.background)
    d = ImageDraw.Draw(img)
    # a lighter panel behind the subject so it reads as a picture, not a flat fill
    r, g, b = sample.background
    d.rounded_rectangle([110, 78, WIDTH - 110, HEIGHT - 78], radius=18,
                        fill=(min(r + 40, 255), min(g + 40, 255), min(b + 40, 255)))
    cy = HEIGHT // 2 + (20 if sample.script == "cjk" else 0)
    SUBJECTS[sample.subject](d, WIDTH // 2, cy)
    font_path = find_font(sample.script)
    big = 56 if sample.script == "cjk" else 46
    _caption(d, sample.top, font_path, top=True, max_size=big)
    _caption(d, sample.bottom, font_path, top=False, max_size=big)
    return img


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def _jpeg_bytes(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False)
    return buf.getvalue()


def generate_samples(out_dir: Path | str, *, limit: int | None = None) -> list[Path]:
    """Write the samples (and their near-duplicates) into ``out_dir``; returns the paths written.

    ``limit`` keeps the first N originals (Chinese ones are interleaved so a small demo still has
    some), plus the near-duplicates whose source is among them. Same bytes on every run.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen = _select(limit)
    rendered: dict[str, Image.Image] = {}
    written: list[Path] = []
    for sample in chosen:
        img = render_sample(sample)
        rendered[sample.name] = img
        path = out / sample.filename
        write_atomic(path, _png_bytes(img), durable=False, sync_dir=False)  # regenerable
        written.append(path)
    for filename, (source, scale, quality) in NEAR_DUPLICATES.items():
        if source not in rendered:
            continue
        img = rendered[source]
        if scale != 1.0:
            img = img.resize((round(WIDTH * scale), round(HEIGHT * scale)), Image.Resampling.LANCZOS)
        path = out / filename
        write_atomic(path, _jpeg_bytes(img, quality), durable=False, sync_dir=False)
        written.append(path)
    return written


def _select(limit: int | None) -> list[Sample]:
    if limit is None or limit >= len(SAMPLES):
        return list(SAMPLES)
    latin = [s for s in SAMPLES if s.script == "latin"]
    cjk = [s for s in SAMPLES if s.script == "cjk"]
    n_cjk = min(len(cjk), max(1, limit // 5)) if limit >= 3 else 0
    return latin[: limit - n_cjk] + cjk[:n_cjk]
