"""The search benchmark's data is sound and deterministic (it is the instrument others tune against)."""

from __future__ import annotations

import hashlib

from bench import search_data


def test_dataset_is_sound() -> None:
    assert search_data.check_dataset() == []
    langs = [m.lang for m in search_data.MEMES]
    assert langs.count("en") >= 100 and langs.count("zh") >= 55
    subset = search_data.memes(subset=True)
    assert {m.lang for m in subset} == {"en", "zh"} and len({m.style for m in subset}) == len(search_data.STYLES)


def test_display_names_do_not_leak_captions() -> None:
    for m in search_data.MEMES:
        assert m.filename.startswith(f"meme-{m.id}.")


def test_same_bytes_every_run(tmp_path) -> None:
    chosen = search_data.memes(subset=True)[:4] + [search_data.BY_ID[search_data.TWIN_IDS[0]]]
    a = search_data.write_dataset(tmp_path / "a", chosen)
    b = search_data.write_dataset(tmp_path / "b", chosen)
    digest = lambda paths: [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]  # noqa: E731
    assert digest(a.images.values()) == digest(b.images.values())
    assert digest(a.twins.values()) == digest(b.twins.values()) and len(a.twins) == 1
    assert a.manifest.read_bytes() == b.manifest.read_bytes()


def test_the_gate_check_fails_a_broken_search() -> None:
    from bench.search_quality import evaluate, gate_failures

    chosen = search_data.memes(subset=True)
    image_ids = {m.id: f"img-{m.id}" for m in chosen}
    by_text = {q: image_ids[m.id] for m in chosen for q in (m.exact, m.paraphrase)}
    right = evaluate(lambda q: [by_text[q]], chosen, image_ids).table()
    wrong = evaluate(lambda q: sorted(set(image_ids.values()) - {by_text[q]})[:10], chosen, image_ids).table()
    thresholds = {cell: 0.5 for cell in right}
    assert gate_failures(right, thresholds) == []
    assert len(gate_failures(wrong, thresholds)) == len(thresholds)
