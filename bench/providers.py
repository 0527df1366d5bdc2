"""Throughput of each stage provider on this CPU: images/s and text embeddings/s.

Run: PYTHONPATH=. python bench/providers.py [--images N] [--size PX]
Prints one line per provider; figures go into docs/providers.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image, ImageDraw, ImageFont

from app.stages import registry
from app.stages.images import DecodedImage, decode_image

LATIN_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"


def make_images(count: int, size: int) -> list[DecodedImage]:
    """Small generated memes: a coloured background with a caption, PNG round-tripped."""
    import io

    font = ImageFont.truetype(LATIN_FONT, max(12, size // 10))
    images = []
    for i in range(count):
        img = Image.new("RGB", (size, size), ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256))
        draw = ImageDraw.Draw(img)
        draw.rectangle([0, 0, size, size // 5], fill="white")
        draw.text((8, 4), f"MEME {i} LOL", font=font, fill="black")
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        images.append(decode_image(buf.getvalue()))
    return images


def rate(count: int, func) -> float:
    """Items per second for ``func()`` processing ``count`` items (after one warm-up call)."""
    start = time.perf_counter()
    func()
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    images = make_images(args.images, args.size)
    print(f"# {args.images} generated {args.size}x{args.size} PNG images")

    import io

    buf = io.BytesIO()
    images[0].image.save(buf, format="PNG")
    data = buf.getvalue()
    speed = rate(args.decode, lambda: [decode_image(data) for _ in range(args.decode)])
    print(f"decode_image            {speed:9.1f} images/s")

    for name in ("perceptual-v1", "deterministic"):
        provider = registry.get_visual_provider(name)
        provider.embed(images[:1])
        speed = rate(len(images), lambda provider=provider: provider.embed(images))
        print(f"visual {name:16s} {speed:9.1f} images/s")

    with tempfile.TemporaryDirectory() as results_dir:
        for name in ("local-ocr", "deterministic"):
            agent = registry.get_agent_provider(name, results_dir=results_dir)
            agent.describe(images[0], attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid")

            def run(agent=agent) -> None:
                for img in images:
                    agent.describe(img, attempt_id=uuid.uuid4().hex, reverse_image_policy="forbid")

            print(f"agent  {name:16s} {rate(len(images), run):9.2f} images/s")

    docs = [
        f"meme number {i}: a cat reacting to monday morning coffee, tags cat monday"
        for i in range(64)
    ]
    for name in ("all-MiniLM-L6-v2", "deterministic"):
        text = registry.get_text_provider(name)
        text.embed(docs[:2])
        for batch in (1, 8, 32):

            def run(text=text, batch=batch) -> None:
                for i in range(0, len(docs), batch):
                    text.embed(docs[i : i + batch])

            print(f"text   {name:16s} batch {batch:2d} {rate(len(docs), run):9.1f} embeddings/s")


if __name__ == "__main__":
    main()
