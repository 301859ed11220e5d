#!/usr/bin/env python3
"""llamacpp_quantize.py — quantize a GGUF with llama.cpp's own quantizer.

    python3 tests/llamacpp_quantize.py IN.gguf OUT.gguf FTYPE

FTYPE is llama.cpp's llama_ftype number (2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0, 9 Q5_1,
10 Q2_K, 12 Q3_K_M, 15 Q4_K_M, 17 Q5_K_M, 18 Q6_K, 30 IQ4_XS). It calls
llama_model_quantize in the prebuilt libllama of the npm package node-llama-cpp
(pinned in scripts/test-deps, installed into .cache/npm-llama) through ctypes:
the files users download are made by this function, so tests can check that
tandem reads them. Nothing is built from source. Exit 0 when the file was written.
"""
import ctypes
import os
import sys

LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                   ".cache/npm-llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64")


class Params(ctypes.Structure):
    # llama_model_quantize_params, returned by value: only its first two fields
    # (int32 nthread, int32 ftype) are set here; the buffer is larger than the
    # struct, so the library's own defaults fill the rest
    _fields_ = [("raw", ctypes.c_uint8 * 512)]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    for name in ("libggml-base.so", "libggml.v0.5.0.so"):
        ctypes.CDLL(os.path.join(LIB, name), mode=ctypes.RTLD_GLOBAL)
    ll = ctypes.CDLL(os.path.join(LIB, "libllama.v0.5.0.so"), mode=ctypes.RTLD_GLOBAL)
    ll.llama_model_quantize_default_params.restype = Params
    ll.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Params)]
    ll.llama_model_quantize.restype = ctypes.c_uint32
    p = ll.llama_model_quantize_default_params()
    ctypes.c_int32.from_buffer(p.raw, 0).value = 2
    ctypes.c_int32.from_buffer(p.raw, 4).value = int(sys.argv[3])
    ll.llama_backend_init()
    rc = ll.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))
    sys.exit(0 if rc == 0 and os.path.exists(sys.argv[2]) else 1)


if __name__ == "__main__":
    main()
