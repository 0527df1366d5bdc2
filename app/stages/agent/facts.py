"""Basic visual facts every agent context carries, computed locally from the pixels."""

from __future__ import annotations

from typing import Any

from PIL import Image

from app.stages.images import DecodedImage

_THUMB_SIDE = 64


def dominant_colors(image: Image.Image, count: int = 3) -> list[str]:
    """Return up to ``count`` dominant colours as ``#rrggbb``, most frequent first."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")  # a decoded image is RGB: no full-size copy
    thumb = rgb.resize((_THUMB_SIDE, _THUMB_SIDE), Image.Resampling.BOX)
    quantised = thumb.quantize(colors=max(count, 1) * 2, method=Image.Quantize.MEDIANCUT)
    palette = quantised.getpalette() or []
    counts = sorted(quantised.getcolors() or [], key=lambda c: (-c[0], c[1]))
    colours: list[str] = []
    for _, index in counts:
        r, g, b = palette[index * 3 : index * 3 + 3]
        hex_colour = f"#{r:02x}{g:02x}{b:02x}"
        if hex_colour not in colours:
            colours.append(hex_colour)
        if len(colours) == count:
            break
    return colours


def visual_facts(image: DecodedImage) -> dict[str, Any]:
    """The ``facts`` entry of a context: width, height, dominant_colors, animated."""
    return {
        "width": image.width,
        "height": image.height,
        "dominant_colors": dominant_colors(image.image),
        "animated": image.animated,
    }


def describe_facts(facts: dict[str, Any]) -> str:
    """One deterministic sentence about the facts, used when no model wrote a description."""
    kind = "animated" if facts.get("animated") else "still"
    colours = ", ".join(facts.get("dominant_colors") or []) or "unknown"
    return f"A {facts['width']}x{facts['height']} {kind} image; dominant colours {colours}."
