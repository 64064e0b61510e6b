#!/usr/bin/env python3
"""Strata's reference dequantizers against the gguf package's.

For every format Strata's type table knows, builds many random valid blocks
(random bytes, with every scale field forced to a finite value: mostly of
moderate magnitude, plus a share of extreme-but-finite ones such as f16
subnormals, 65504 and E8M0 0/255), dequantizes them with qt_dequantize (the C
library, through ctypes) and with gguf.quants.dequantize, and compares:
bit equality for F32/F16/BF16, at most 1 ulp elsewhere (Strata aims at exact;
the maximum is printed). Q8_1/Q8_K (activation formats, absent from gguf) and
the integer/F64 types are checked against a NumPy formula written here.

Also checks the table itself: names, block sizes and byte sizes against
gguf's GGML_QUANT_SIZES, the dot activation type of every format,
qt_get on unknown ids, qt_from_name (case-insensitive) and qt_row_size.

Run: STRATA_LIB=build/src/libstrata.so python3 tests/quant/test_dequant.py
Exit status is non-zero on any failure.
"""
import ctypes
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf import quants as gq

N_MODERATE = 12000  # blocks with moderate scales, per format
N_EXTREME = 4000    # blocks with extreme-but-finite scales, per format
N_ELEMS = 200000    # elements for the block-size-1 types

# Formats and the activation type of their dot product (from DESIGN/quant.h).
DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F32, T.BF16: T.F32,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0, T.MXFP4: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1, T.Q8_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K, T.Q8_K: T.Q8_K,
    T.IQ2_XXS: T.Q8_K, T.IQ2_XS: T.Q8_K, T.IQ2_S: T.Q8_K, T.IQ3_XXS: T.Q8_K, T.IQ3_S: T.Q8_K,
    T.IQ1_S: T.Q8_K, T.IQ1_M: T.Q8_K, T.IQ4_XS: T.Q8_K,
}
PLAIN = {T.I8: np.int8, T.I16: np.int16, T.I32: np.int32, T.I64: np.int64, T.F64: np.float64}
EXACT = {T.F32, T.F16, T.BF16} | set(PLAIN)

# Byte offsets of the f16 scale fields in each block (blocks.h / gguf layouts).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q8_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0],
}
# gguf-py still lists Q8_1 with f32 d and s (40 bytes); ggml's block_q8_1 (and
# Strata's) holds two f16s: 36 bytes. Q8_1 never appears in files.
SIZE_OVERRIDE = {T.Q8_1: (32, 36)}


class Traits(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("blck", ctypes.c_int), ("type_size", ctypes.c_int),
                ("vec_dot_type", ctypes.c_int), ("dequant", ctypes.c_void_p), ("quantize", ctypes.c_void_p)]


def load_lib():
    path = os.environ.get("STRATA_LIB")
    if not path:
        sys.exit("STRATA_LIB is not set (path to libstrata.so)")
    lib = ctypes.CDLL(path)
    lib.qt_get.restype = ctypes.POINTER(Traits)
    lib.qt_get.argtypes = [ctypes.c_int]
    lib.qt_from_name.restype = ctypes.c_int
    lib.qt_from_name.argtypes = [ctypes.c_char_p]
    lib.qt_row_size.restype = ctypes.c_size_t
    lib.qt_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.qt_dequantize.restype = None
    lib.qt_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def random_f16(rng, n, extreme):
    """f16 bit patterns: finite, moderate (|x| in 2^-10..2^4) or any finite incl. subnormals/65504."""
    if extreme:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        exp = (bits >> 10) & 0x1F
        bits = np.where(exp == 0x1F, bits & np.uint16(0x83FF) | np.uint16(0x7800), bits)  # inf/NaN -> 2^15 range
        # make sure the very edges appear: max finite, min subnormal, zero
        k = min(n, 30)
        edges = np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x0400], dtype=np.uint16)
        bits[:k] = np.resize(edges, k)
        return bits.astype(np.uint16)
    mag = np.exp2(rng.uniform(-10, 4, n)).astype(np.float32)
    sign = np.where(rng.integers(0, 2, n) == 1, -1, 1).astype(np.float32)
    return (mag * sign).astype(np.float16).view(np.uint16)


def set_u16(blocks, off, vals):
    blocks[:, off] = (vals & 0xFF).astype(np.uint8)
    blocks[:, off + 1] = (vals >> 8).astype(np.uint8)


def make_blocks(rng, qt, nb, type_size, extreme):
    """Random bytes with every scale field forced finite."""
    blocks = rng.integers(0, 256, (nb, type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(qt, []):
        set_u16(blocks, off, random_f16(rng, nb, extreme).astype(np.uint32))
    if qt == T.IQ1_M:
        # the f16 super-scale is the top nibbles of the 4 uint16 scale words (bytes 48..55)
        d = random_f16(rng, nb, extreme).astype(np.uint32)
        for w in range(4):
            lo, hi = 48 + 2 * w, 48 + 2 * w + 1
            blocks[:, hi] = (blocks[:, hi] & 0x0F) | (((d >> (4 * w)) & 0xF) << 4).astype(np.uint8)
    if qt == T.Q8_K:
        if extreme:
            bits = rng.integers(0, 1 << 32, nb, dtype=np.uint64).astype(np.uint32)
            exp = (bits >> 23) & 0xFF
            bits = np.where(exp == 0xFF, bits & np.uint32(0x807FFFFF) | np.uint32(0x7E800000), bits)
            d = bits.view(np.float32)
        else:
            d = (np.exp2(rng.uniform(-20, 4, nb)) * np.where(rng.integers(0, 2, nb) == 1, -1, 1)).astype(np.float32)
        blocks[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(nb, 4)
    if qt == T.MXFP4:
        # every E8M0 byte is finite in gguf's convention (255 -> 2^127)
        blocks[:, 0] = rng.integers(0, 256, nb) if extreme else rng.integers(110, 145, nb)
    return blocks


def make_plain(rng, qt, n, extreme):
    """Elements of a block-size-1 type, as bytes; NaN-free for float types."""
    if qt == T.F32:
        bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        if not extreme:
            bits = rng.standard_normal(n).astype(np.float32).view(np.uint32)
        bits = np.where((bits & 0x7FFFFFFF) > 0x7F800000, bits & np.uint32(0xBFFFFFFF), bits)  # NaN -> finite
        return bits.view(np.uint8)
    if qt in (T.F16, T.BF16):
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        if qt == T.F16:
            bits = np.where((bits & 0x7FFF) > 0x7C00, bits & np.uint16(0xBFFF), bits)
        else:
            bits = np.where((bits & 0x7FFF) > 0x7F80, bits & np.uint16(0xBFFF), bits)
        return bits.astype(np.uint16).view(np.uint8)
    dt = PLAIN[qt]
    if dt == np.float64:
        v = rng.standard_normal(n) * (1e30 if extreme else 10.0)
        return v.astype(np.float64).view(np.uint8)
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return v.view(np.uint8)


def reference(qt, data, blck, type_size):
    """The oracle: gguf's dequantizer, or a NumPy formula where gguf has none."""
    if qt in PLAIN:
        return data.view(PLAIN[qt]).astype(np.float32)
    if qt == T.Q8_1:  # d (f16), s (f16), 32 x int8: w = d * q
        b = data.reshape(-1, type_size)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (d * b[:, 4:].view(np.int8).astype(np.float32)).reshape(-1)
    if qt == T.Q8_K:  # d (f32), 256 x int8, 16 x int16 bsums: w = d * q
        b = data.reshape(-1, type_size)
        d = b[:, 0:4].copy().view(np.float32)
        return (d * b[:, 4:4 + 256].view(np.int8).astype(np.float32)).reshape(-1)
    return np.asarray(gq.dequantize(data, qt), dtype=np.float32).reshape(-1)


def ulp_dist(a, b):
    """Max distance in f32 units-in-the-last-place; NaN positions must agree."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    # map the sign-magnitude bit patterns onto a monotone integer line (-0 == +0)
    oa = np.where(ia < 0, -(1 << 31) - ia, ia)
    ob = np.where(ib < 0, -(1 << 31) - ib, ib)
    na, nb = np.isnan(a), np.isnan(b)
    d = np.abs(oa - ob)
    d = np.where(na & nb, 0, d)
    d = np.where(na != nb, 1 << 40, d)
    return int(d.max()) if d.size else 0


def check_dequant(lib, rng, qt):
    tr = lib.qt_get(int(qt)).contents
    blck, ts = tr.blck, tr.type_size
    chunks = []
    if blck == 1:
        chunks = [make_plain(rng, qt, N_ELEMS, False), make_plain(rng, qt, N_ELEMS // 4, True)]
    else:
        chunks = [make_blocks(rng, qt, N_MODERATE, ts, False).reshape(-1),
                  make_blocks(rng, qt, N_EXTREME, ts, True).reshape(-1)]
    data = np.ascontiguousarray(np.concatenate(chunks))
    nblocks = data.size // ts
    n = nblocks * blck
    out = np.full(n, np.nan, dtype=np.float32)
    lib.qt_dequantize(int(qt), data.ctypes.data, out.ctypes.data, n)
    ref = reference(qt, data, blck, ts)
    assert ref.shape == out.shape, (ref.shape, out.shape)
    if qt in EXACT:
        ok_bits = np.array_equal(out.view(np.uint32), ref.view(np.uint32))
        mu = ulp_dist(out, ref)
        ok = ok_bits
        tol = "bit-exact"
    else:
        mu = ulp_dist(out, ref)
        ok = mu <= 1
        tol = "<=1 ulp"
    n_diff = int(np.count_nonzero(out.view(np.uint32) != ref.view(np.uint32)))
    print(f"{qt.name:8s} blocks {nblocks:7d}  max ulp {mu:<4d} differing values {n_diff:<6d} ({tol})  "
          f"{'PASS' if ok else 'FAIL'}")
    if not ok:
        bad = np.nonzero(out.view(np.uint32) != ref.view(np.uint32))[0][:5]
        for i in bad:
            print(f"    element {i} (block {i // blck}): strata {out[i]!r} reference {ref[i]!r}")
    return ok


def check_table(lib):
    ok = True

    def expect(cond, what):
        nonlocal ok
        if not cond:
            ok = False
            print(f"  FAIL: {what}")
        return cond

    known = set(DOT_TYPE) | set(PLAIN)
    for t in range(0, 64):
        p = lib.qt_get(t)
        try:
            qt = T(t)
        except ValueError:
            qt = None
        if qt in known:
            if not expect(bool(p), f"qt_get({t}) is NULL for {qt.name}"):
                continue
            tr = p.contents
            blck, ts = SIZE_OVERRIDE.get(qt, GGML_QUANT_SIZES[qt])
            expect(tr.name.decode() == qt.name, f"name of {t}: {tr.name!r} != {qt.name}")
            expect((tr.blck, tr.type_size) == (blck, ts),
                   f"{qt.name} geometry ({tr.blck},{tr.type_size}) != ({blck},{ts})")
            expect(bool(tr.dequant), f"{qt.name} has no dequantizer")
            if qt in DOT_TYPE:
                expect(tr.vec_dot_type == int(DOT_TYPE[qt]),
                       f"{qt.name} vec_dot_type {tr.vec_dot_type} != {int(DOT_TYPE[qt])}")
        else:
            expect(not p, f"qt_get({t}) should be NULL (type not supported)")
    for t in (-1, -1000, 1 << 20, 2**31 - 1):
        expect(not lib.qt_get(t), f"qt_get({t}) should be NULL")
    print(f"table: {len(known)} types checked against GGML_QUANT_SIZES/names/dot types, "
          f"unknown ids 0..63 and out-of-range ids give NULL: {'PASS' if ok else 'FAIL'}")

    ok_names = True
    for qt in known:
        for s in (qt.name, qt.name.lower(), qt.name.swapcase(), qt.name.capitalize()):
            if lib.qt_from_name(s.encode()) != int(qt):
                ok_names = False
                print(f"  FAIL: qt_from_name({s!r}) = {lib.qt_from_name(s.encode())}, want {int(qt)}")
    for s in (b"", b"Q4", b"Q4_K_M", b"TQ1_0", b"q4_0 ", b"F32x", b"NVFP4"):
        if lib.qt_from_name(s) != -1:
            ok_names = False
            print(f"  FAIL: qt_from_name({s!r}) should be -1")
    if lib.qt_from_name(None) != -1:
        ok_names = False
        print("  FAIL: qt_from_name(NULL) should be -1")
    print(f"qt_from_name: exact/lower/swapped/capitalized names and 8 unknown names: {'PASS' if ok_names else 'FAIL'}")

    ok_rows = True
    for qt in known:
        blck, ts = SIZE_OVERRIDE.get(qt, GGML_QUANT_SIZES[qt])
        for nblk in (0, 1, 37, 4096):
            got = lib.qt_row_size(int(qt), nblk * blck)
            if got != nblk * ts:
                ok_rows = False
                print(f"  FAIL: qt_row_size({qt.name}, {nblk * blck}) = {got}, want {nblk * ts}")
        if blck > 1 and lib.qt_row_size(int(qt), blck + 1) != 0:
            ok_rows = False
            print(f"  FAIL: qt_row_size({qt.name}, {blck + 1}) should be 0 (not whole blocks)")
        if lib.qt_row_size(int(qt), -blck) != 0:
            ok_rows = False
            print(f"  FAIL: qt_row_size({qt.name}, {-blck}) should be 0")
    for t in (5, 34, 40, -3):
        if lib.qt_row_size(t, 256) != 0:
            ok_rows = False
            print(f"  FAIL: qt_row_size(unknown {t}) should be 0")
    print(f"qt_row_size: whole rows of every type, partial/negative rows and unknown types give 0: "
          f"{'PASS' if ok_rows else 'FAIL'}")
    return ok and ok_names and ok_rows


def main():
    lib = load_lib()
    rng = np.random.default_rng(20240531)
    ok = check_table(lib)
    order = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K,
             T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
             T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.I8, T.I16, T.I32, T.I64, T.F64]
    n_fail = 0
    with np.errstate(over="ignore"):  # extreme scales overflow to inf in both implementations
        for qt in order:
            if not lib.qt_get(int(qt)):
                print(f"{qt.name:8s} missing from the table  FAIL")
                n_fail += 1
                continue
            if not check_dequant(lib, rng, qt):
                n_fail += 1
    if not ok:
        n_fail += 1
    print(f"{len(order)} formats dequantized; {'all PASS' if n_fail == 0 else f'{n_fail} FAILED'}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
