"""app.db.jsoncodec: orjson where it gives json's values, json where it would not (issue 21)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import random
import uuid
from enum import StrEnum

import numpy as np
import pytest

from app.db import jsoncodec
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store.artifacts import _vec


class Colour(StrEnum):
    RED = "red"


class _Text(str):
    """A str subclass that renders itself otherwise: encoders must write its characters."""

    def __str__(self) -> str:
        return "not these characters"


@dataclasses.dataclass
class Point:
    x: int


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "bigint", "float", "str", "bool", "none"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == "bigint":
        return rng.choice([1, -1]) * rng.randint(2**64, 2**200)
    if kind == "float":
        return rng.choice([rng.random(), rng.uniform(-1e300, 1e300), rng.random() * 1e-300, 0.0, -0.0, 1e16, 1e-5,
                           float(rng.randint(0, 2**60)), 5e-324])
    if kind == "str":
        return "".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 12)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {str(_random_value(rng, 3)): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


@pytest.mark.parametrize("seed", range(20))
def test_loads_gives_json_values_on_varied_documents(seed):
    rng = random.Random(seed)
    for _ in range(200):
        value = _random_value(rng)
        for text in (json.dumps(value), canonical_json(value), json.dumps(value, indent=1)):
            got, want = jsoncodec.loads(text.encode()), json.loads(text)
            assert got == want and repr(got) == repr(want)  # repr: an int stays an int, -0.0 stays -0.0
            assert repr(jsoncodec.loads(memoryview(text.encode()))) == repr(want)


def test_loads_keeps_integers_beyond_64_bits():
    for n in (2**63, 2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**40)):
        doc = json.dumps({"n": n, "l": [n]})
        assert jsoncodec.loads(doc.encode()) == {"n": n, "l": [n]}
        assert type(jsoncodec.loads(doc.encode())["n"]) is int


@pytest.mark.parametrize("seed", range(20))
def test_dumps_round_trips_to_json_dumps_values(seed):
    rng = random.Random(seed)
    for _ in range(200):
        value = _random_value(rng)
        assert json.loads(jsoncodec.dumps(value)) == json.loads(json.dumps(value, default=str))


def test_dumps_converts_what_json_default_str_converts():
    stamp = dt.datetime(2026, 12, 1, 23, 0, 1, 5, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {"t": stamp, "d": stamp.date(), "u": ident, "e": Colour.RED, "p": Point(1), "tu": (1, 2),
             "f32": np.float32(0.5), "f64": np.float64(0.25), "i64": np.int64(7), "big": 2**70, "ok": True}
    assert json.loads(jsoncodec.dumps(value)) == json.loads(json.dumps(value, default=str))
    assert json.loads(jsoncodec.dumps({1: "a", None: "b"})) == json.loads(json.dumps({1: "a", None: "b"}))


def test_vector_text_is_the_same_floats():
    rng = random.Random(3)
    vec = [rng.uniform(-1, 1) for _ in range(64)] + [1e-5, 1e16, -0.0, 0.0, 5e-324]
    for given in (vec, np.array(vec, dtype=np.float32), [np.float64(x) for x in vec], [1, 2, 3]):
        want = [float(x) for x in given]
        assert json.loads(_vec(given)) == want


def _reference_canonical(value) -> str:
    # the definition the fingerprints and dedupe keys were made with: its bytes must never change
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _plain_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "str", "strsub", "bool", "none"] + (["list", "tuple", "dict"] if depth < 4 else []))
    if kind == "strsub":  # a str subclass (a StrEnum member, or one wrapping any characters): plain too
        return rng.choice([Colour.RED, _Text("".join(chr(rng.randint(0, 0xD7FF)) for _ in range(rng.randint(0, 6))))])
    if kind == "int":
        return rng.choice([rng.randint(-(2**63), 2**64 - 1), rng.randint(-5, 5), 2**64, -(2**63) - 1, 2**100])
    if kind == "str":
        # every control character, both surrogate neighbours, the BMP's end and astral planes
        return "".join(chr(rng.choice([rng.randint(0, 0x20), rng.randint(0x21, 0x7F), rng.randint(0x80, 0xD7FF),
                                       rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 10)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind in ("list", "tuple"):
        items = [_plain_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
        return items if kind == "list" else tuple(items)
    keys = ["".join(chr(rng.choice([rng.randint(0x20, 0x7F), rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)]))
                    for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 6))]
    return {k: _plain_value(rng, depth + 1) for k in keys}


def _nested(depth: int):
    value: object = "deep"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("seed", range(20))
def test_canonical_json_is_byte_for_byte_the_reference_encoding(seed):
    from app.orchestrator.fingerprints import canonical_json_bytes, sha256_hex

    rng = random.Random(seed)
    for _ in range(300):
        value = _plain_value(rng) if rng.random() < 0.7 else _random_value(rng)
        try:
            want = _reference_canonical(value)
        except TypeError:  # keys of mixed types cannot be sorted: both refuse
            with pytest.raises(TypeError):
                canonical_json(value)
            continue
        assert canonical_json(value) == want
        assert canonical_json_bytes(value) == want.encode("utf-8")
        assert sha256_hex(value) == hashlib.sha256(want.encode("utf-8")).hexdigest()


def test_canonical_json_keeps_what_only_the_reference_encoder_writes():
    from app.orchestrator.fingerprints import canonical_json_bytes

    stamp = dt.datetime(2026, 12, 1, 23, 0, 1, 5, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    for value in (
        {"f": 1e-05, "g": 1e16, "h": -0.0, "nan": float("nan"), "inf": float("-inf")},  # float forms orjson writes otherwise
        {"e": Colour.RED, "t": stamp, "u": ident, "p": Point(1), "n": np.int64(3)},  # default=str and subclasses
        {"big": 2**70, "small": -(2**64)},  # beyond 64 bits: orjson refuses
        {1: "an int key", 2: "another"},  # json writes keys other than str as str; orjson refuses them
        {_Text("b"): 1, "a": [_Text("x")]},  # a str subclass as a key: sorted by its own rules
        _nested(40),  # deeper than the plain check looks
        _nested(300),  # deeper than orjson encodes
        {"lone": "\ud800"},  # a lone surrogate: json writes it, orjson refuses
        ["a", ("b", True), {"z": None, "a": 1}],
    ):
        assert canonical_json(value) == _reference_canonical(value)
    with pytest.raises(UnicodeEncodeError):  # as before: a lone surrogate has no UTF-8 bytes to hash
        canonical_json_bytes({"lone": "\ud800"})
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular"):
        canonical_json(cycle)


def test_canonical_json_of_plain_values_skips_the_standard_encoder(monkeypatch):
    from app.orchestrator import fingerprints

    class Refusing:
        def encode(self, value):
            raise AssertionError("the standard encoder ran for a plain value")

    monkeypatch.setattr(fingerprints, "_CANONICAL", Refusing())
    value = {"image_id": str(uuid.uuid4()), "stage": "agent", "n": [1, True, None, ("x",)], "汉字": "😀\n"}
    assert fingerprints.canonical_json(value) == _reference_canonical(value)
    assert fingerprints.sha256_hex(value) == hashlib.sha256(_reference_canonical(value).encode()).hexdigest()


def test_dedupe_key_of_a_stage_member_is_the_reference_key_on_the_fast_encoder(monkeypatch):
    from app.db.enums import Stage
    from app.orchestrator import fingerprints

    image_id, fingerprint = uuid.uuid4(), "f" * 64
    for stage in Stage:
        want = hashlib.sha256(_reference_canonical(
            {"image_id": str(image_id), "stage": stage, "fingerprint": fingerprint}).encode()).hexdigest()
        assert fingerprints.dedupe_key(image_id, stage, fingerprint) == want
        assert fingerprints.dedupe_key(image_id, stage.value, fingerprint) == want

    class Refusing:
        def encode(self, value):
            raise AssertionError("the standard encoder ran for a dedupe key")

    monkeypatch.setattr(fingerprints, "_CANONICAL", Refusing())
    fingerprints.dedupe_key(image_id, Stage.AGENT, fingerprint)
