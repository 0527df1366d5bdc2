"""app.db.jsoncodec: orjson where it gives json's values, json where it would not (issue 21)."""

from __future__ import annotations

import dataclasses
import datetime as dt
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
