"""Deterministic rendered memes with known captions, for measuring OCR (bench/ocr_quality.py).

Two sets:
- ``samples``: the demo's memes (app/samples), as the demo renders them.
- ``styled``: captions written for this benchmark (none of them the demo's) in styles memes use:
  outlined all-caps in a condensed or regular bold face, small caption text above a picture,
  coloured text with a drop shadow, serif mixed case; Chinese in each style, some mixed with
  English. Seeded, so every run draws the same images.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

_FONTS = Path("/usr/share/fonts/truetype")
BOLD = _FONTS / "dejavu/DejaVuSans-Bold.ttf"
CONDENSED = _FONTS / "dejavu/DejaVuSansCondensed-Bold.ttf"
NARROW = _FONTS / "liberation/LiberationSansNarrow-Bold.ttf"
SANS = _FONTS / "liberation/LiberationSans-Regular.ttf"
SERIF = _FONTS / "dejavu/DejaVuSerif-Bold.ttf"
CJK = _FONTS / "wqy/wqy-microhei.ttc"


@dataclass(frozen=True)
class Meme:
    """One benchmark image: a name, its language ("en" | "zh") and the caption lines drawn."""

    name: str
    lang: str
    lines: tuple[str, ...]
    image: Image.Image

    @property
    def caption(self) -> str:
        return "\n".join(self.lines)


# (top, bottom) — everyday meme sentences; short and long, one or two lines.
ENGLISH = (
    ("WHEN YOU FINALLY", "FIND THE REMOTE"),
    ("NOBODY:", "ABSOLUTELY NOBODY:"),
    ("I SAID WHAT I SAID", ""),
    ("THIS IS FINE", ""),
    ("HOW IT STARTED", "HOW IT IS GOING"),
    ("MY BRAIN AT 3 AM", "REMEMBER THAT THING YOU SAID"),
    ("ME TRYING TO", "ADULT TODAY"),
    ("WHY ARE YOU", "THE WAY THAT YOU ARE"),
    ("TAKE MY MONEY", ""),
    ("SHUT UP AND", "TAKE MY MONEY"),
    ("YOU HAD ONE JOB", ""),
    ("WHEN THE WIFI", "DROPS FOR A SECOND"),
    ("ALL THE THINGS", ""),
    ("NOT SURE IF TIRED", "OR JUST BORED"),
    ("BRACE YOURSELVES", "WINTER IS COMING"),
    ("WAIT FOR IT", ""),
    ("ME WHEN THE FOOD", "ARRIVES"),
    ("THAT FEELING WHEN", "YOUR PLANS GET CANCELLED"),
    ("I AM ONCE AGAIN", "ASKING FOR A NAP"),
    ("FIVE MORE MINUTES", "SAID EVERYONE EVER"),
    ("WHEN SOMEONE SAYS", "THEY DO NOT LIKE PIZZA"),
    ("LOOK AT ME", "I AM THE CAPTAIN NOW"),
    ("MOM SAID IT IS", "MY TURN ON THE COMPUTER"),
    ("CHANGE MY MIND", ""),
    ("IS THIS A PIGEON", ""),
    ("WHAT IF I TOLD YOU", "IT WAS MONDAY AGAIN"),
    ("EVERYTHING IS", "UNDER CONTROL"),
    ("ON MY WAY", "TO EAT ALL THE SNACKS"),
    ("THEY SEE ME ROLLING", "THEY HATING"),
    ("WHEN IT IS FRIDAY", "BUT YOU WORK SATURDAY"),
    ("Me explaining to my mom", "why I need another plant"),
    ("When you hear the ice cream truck", ""),
    ("Just one more episode", "it will be fine"),
    ("The weekend went by too fast", ""),
    ("Accidentally opened the front camera", ""),
)

CHINESE = (
    ("打工人打工魂", ""),
    ("我也太难了吧", ""),
    ("今天不想上班", ""),
    ("躺平是最好的选择", ""),
    ("干饭人干饭魂", ""),
    ("好家伙", "原来是这样"),
    ("你品你细品", ""),
    ("别问问就是穷", ""),
    ("熬夜冠军", "就是我本人"),
    ("老板说要加班", ""),
    ("这个周末谁也别找我", ""),
    ("减肥从明天开始", ""),
    ("心态崩了", ""),
    ("我太南了", "南到了北极"),
    ("早睡早起身体好", ""),
    ("抢红包手速太慢了", ""),
    ("快乐星期五", ""),
    ("钱包空空如也", ""),
    ("这也太真实了", ""),
    ("我不听我不听", ""),
    ("今天又是元气满满的一天", ""),
    ("emo了", "需要抱抱"),
    ("学习使我快乐", ""),
    ("这波操作666", ""),
    ("周一综合症", "又犯了"),
    ("猫咪在键盘上睡着了", ""),
    ("放假倒计时", "还有三天"),
    ("OK的没问题", ""),
)


def _background(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """A blurred blotchy picture: something busy behind the text, like a photo."""
    w, h = size
    img = Image.new("RGB", size, tuple(rng.randrange(40, 200) for _ in range(3)))
    d = ImageDraw.Draw(img)
    for _ in range(14):
        x, y, r = rng.randrange(w), rng.randrange(h), rng.randrange(20, 90)
        d.ellipse([x - r, y - r, x + r, y + r], fill=tuple(rng.randrange(256) for _ in range(3)))
    return img.filter(ImageFilter.GaussianBlur(6))


def _fit(d: ImageDraw.ImageDraw, text: str, font: Path, size: int, width: int, stroke: int):
    while size > 12:
        f = ImageFont.truetype(str(font), size)
        left, _, right, _ = d.textbbox((0, 0), text, font=f, stroke_width=stroke)
        if right - left <= width:
            return f
        size -= 2
    return ImageFont.truetype(str(font), size)


def _outlined(rng: random.Random, lines: tuple[str, ...], font: Path) -> Image.Image:
    """Classic meme: white outlined text at top and bottom of a picture."""
    w, h = rng.choice([(480, 360), (400, 400), (600, 420), (320, 320)])
    img = _background(rng, (w, h))
    d = ImageDraw.Draw(img)
    stroke = max(2, w // 160)
    for i, text in enumerate(lines):
        if not text:
            continue
        f = _fit(d, text, font, rng.randrange(36, 60), w - 24, stroke)
        left, top, right, bottom = d.textbbox((0, 0), text, font=f, stroke_width=stroke)
        x = (w - (right - left)) // 2 - left
        y = 10 - top if i == 0 else h - 10 - bottom
        d.text((x, y), text, font=f, fill="white", stroke_width=stroke, stroke_fill="black")
    return img


def _small_caption(rng: random.Random, lines: tuple[str, ...], font: Path) -> Image.Image:
    """A white band with small dark text above a picture (the social-post style)."""
    w = rng.choice([360, 420, 480])
    size = rng.randrange(15, 21)
    f = ImageFont.truetype(str(font), size)
    band = 16 + len([t for t in lines if t]) * int(size * 1.5)
    img = _background(rng, (w, band + w * 2 // 3))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, w, band], fill="white")
    y = 10
    for text in lines:
        if text:
            d.text((12, y), text, font=f, fill=(20, 20, 20))
            y += int(size * 1.5)
    return img


def _shadowed(rng: random.Random, lines: tuple[str, ...], font: Path) -> Image.Image:
    """Coloured text with a drop shadow, centred on a picture."""
    w, h = rng.choice([(480, 300), (400, 300), (520, 360)])
    img = _background(rng, (w, h))
    d = ImageDraw.Draw(img)
    colour = rng.choice([(255, 225, 40), (255, 80, 80), (120, 255, 140), (255, 255, 255)])
    texts = [t for t in lines if t]
    y = h // 2 - 30 * len(texts)
    for text in texts:
        f = _fit(d, text, font, rng.randrange(30, 46), w - 30, 0)
        left, top, right, bottom = d.textbbox((0, 0), text, font=f)
        x = (w - (right - left)) // 2 - left
        d.text((x + 3, y + 3), text, font=f, fill=(0, 0, 0))
        d.text((x, y), text, font=f, fill=colour)
        y += (bottom - top) + 16
    return img


Style = Callable[[random.Random, tuple[str, ...], Path], Image.Image]
_LATIN_STYLES: tuple[tuple[str, Style, Path], ...] = (
    ("outlined-bold", _outlined, BOLD),
    ("outlined-condensed", _outlined, CONDENSED),
    ("outlined-narrow", _outlined, NARROW),
    ("small-sans", _small_caption, SANS),
    ("shadow-serif", _shadowed, SERIF),
)
_CJK_STYLES: tuple[tuple[str, Style, Path], ...] = (
    ("outlined", _outlined, CJK),
    ("small", _small_caption, CJK),
    ("shadow", _shadowed, CJK),
)


def styled(seed: int = 15) -> list[Meme]:
    """Every caption above in one style each (styles taken in turn), deterministically."""
    rng = random.Random(seed)
    memes = []
    for i, pair in enumerate(ENGLISH):
        style, draw, font = _LATIN_STYLES[i % len(_LATIN_STYLES)]
        lines = tuple(t for t in pair if t)
        memes.append(Meme(f"en-{i:02d}-{style}", "en", lines, draw(rng, lines, font)))
    for i, pair in enumerate(CHINESE):
        style, draw, font = _CJK_STYLES[i % len(_CJK_STYLES)]
        lines = tuple(t for t in pair if t)
        memes.append(Meme(f"zh-{i:02d}-{style}", "zh", lines, draw(rng, lines, font)))
    return memes


def samples() -> list[Meme]:
    """The demo's memes (not the near-duplicate files), rendered as the demo does."""
    from app.samples.catalog import SAMPLES
    from app.samples.render import render_sample

    return [
        Meme(s.name, "zh" if s.script == "cjk" else "en",
             tuple(t for t in (s.top, s.bottom) if t), render_sample(s))
        for s in SAMPLES
    ]
