"""Throughput of the open_clip visual provider on this CPU, with randomly initialised weights.

Run under its venv: PYTHONPATH=. .venv-openclip/bin/python bench/open_clip_provider.py
    [--model ViT-B-32] [--images N] [--threads T]

No weights are downloaded: the architecture is built with random weights (speed does not depend
on their values), saved as a checkpoint and loaded through the provider, so the figures are the
provider's real cost for that architecture, not a measure of any trained model's quality.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import open_clip
import torch
from providers import make_images, rate

from app.stages import registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="ViT-B-32", help="an open_clip architecture name")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs ({args.threads} torch thread(s)), torch {torch.__version__}")
    images = make_images(args.images, args.size)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "random.pt"
        torch.manual_seed(0)
        torch.save(open_clip.create_model(args.model).state_dict(), checkpoint)
        size_mb = checkpoint.stat().st_size / 1e6

        start = time.perf_counter()
        provider = registry.get_visual_provider("open_clip", checkpoint_path=str(checkpoint), model_name=args.model)
        hashed = time.perf_counter() - start
        start = time.perf_counter()
        provider.embed(images[:1])  # loads the model
        loaded = time.perf_counter() - start
        print(f"{args.model}: checkpoint {size_mb:.0f} MB, construct+sha256 {hashed:.2f} s, first embed (load) {loaded:.2f} s")
        for batch in (1, 16):
            chunks = [images[i : i + batch] for i in range(0, len(images), batch)]
            per_s = rate(len(images), lambda chunks=chunks: [provider.embed(c) for c in chunks])
            print(f"visual open_clip {args.model}, batch {batch}: {per_s:.1f} images/s")


if __name__ == "__main__":
    main()
