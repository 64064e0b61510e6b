#!/usr/bin/env python3
"""Strata's GGUF reader and writer against the gguf package, both ways.

1. Strata's writer (libstrata through ctypes) writes a file with every
   metadata type, arrays of arrays included, and tensors of six types with
   random bytes; gguf.GGUFReader must read the same keys, types, values,
   tensor names, types, shapes and data bytes.
2. gguf.GGUFWriter writes a file with every metadata type (nested lists
   included), a custom alignment and tensors (F32, F16, I32, raw Q8_0 and
   Q4_K bytes); Strata's reader must return equal values and tensor bytes.

Expected values are the Python-side inputs, never something Strata computed.
Run: STRATA_LIB=build/src/libstrata.so python3 tests/gguf/test_gguf_py.py [workdir]
"""
import ctypes as C
import os
import struct
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

lib = C.CDLL(os.environ.get("STRATA_LIB", "build/src/libstrata.so"))


class GgufTensor(C.Structure):
    _fields_ = [("name", C.c_char_p), ("n_dims", C.c_int), ("ne", C.c_int64 * 4), ("type", C.c_int),
                ("offset", C.c_uint64), ("size", C.c_uint64), ("data", C.c_void_p)]


class GgufValue(C.Structure):
    _fields_ = [("type", C.c_int), ("elem_type", C.c_int), ("n", C.c_uint64), ("raw", C.c_void_p),
                ("elem_off", C.c_void_p)]


FILL = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int64, C.c_void_p, C.c_size_t)
P = C.c_void_p
for name, res, args in [
    ("gguf_open", P, [C.c_char_p]), ("gguf_close", None, [P]), ("st_error_get", C.c_char_p, []),
    ("gguf_version", C.c_uint32, [P]), ("gguf_alignment", C.c_size_t, [P]), ("gguf_n_kv", C.c_int64, [P]),
    ("gguf_key", C.c_char_p, [P, C.c_int64]), ("gguf_find_key", C.c_int64, [P, C.c_char_p]),
    ("gguf_get_value", C.c_int, [P, C.c_int64, C.POINTER(GgufValue)]),
    ("gguf_arr_get_i64", C.c_int, [C.POINTER(GgufValue), C.c_uint64, C.POINTER(C.c_int64)]),
    ("gguf_arr_get_f64", C.c_int, [C.POINTER(GgufValue), C.c_uint64, C.POINTER(C.c_double)]),
    ("gguf_arr_get_str", C.c_int, [C.POINTER(GgufValue), C.c_uint64, C.POINTER(C.c_char_p), C.POINTER(C.c_uint64)]),
    ("gguf_arr_get_value", C.c_int, [C.POINTER(GgufValue), C.c_uint64, C.POINTER(GgufValue)]),
    ("gguf_n_tensors", C.c_int64, [P]), ("gguf_tensor_at", C.POINTER(GgufTensor), [P, C.c_int64]),
    ("gguf_writer_new", P, []), ("gguf_writer_free", None, [P]),
    ("gguf_writer_set_alignment", None, [P, C.c_uint32]),
    ("gguf_w_u32", None, [P, C.c_char_p, C.c_uint32]), ("gguf_w_i32", None, [P, C.c_char_p, C.c_int32]),
    ("gguf_w_u64", None, [P, C.c_char_p, C.c_uint64]), ("gguf_w_f32", None, [P, C.c_char_p, C.c_float]),
    ("gguf_w_bool", None, [P, C.c_char_p, C.c_int]), ("gguf_w_str", None, [P, C.c_char_p, C.c_char_p]),
    ("gguf_w_arr", None, [P, C.c_char_p, C.c_int, C.c_void_p, C.c_uint64]),
    ("gguf_w_arr_str", None, [P, C.c_char_p, C.POINTER(C.c_char_p), C.c_uint64]),
    ("gguf_w_raw", None, [P, C.c_char_p, C.c_int, C.c_char_p, C.c_size_t]),
    ("gguf_w_tensor", None, [P, C.c_char_p, C.c_int, C.c_int, C.POINTER(C.c_int64)]),
    ("gguf_writer_write", C.c_int, [P, C.c_char_p, FILL, C.c_void_p]),
]:
    fn = getattr(lib, name)
    fn.restype = res
    fn.argtypes = args

failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL:", what)


SCALAR_FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
              VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}
NP_OF = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16, VT.UINT32: np.uint32,
         VT.INT32: np.int32, VT.FLOAT32: np.float32, VT.BOOL: np.uint8, VT.UINT64: np.uint64, VT.INT64: np.int64,
         VT.FLOAT64: np.float64}


def f32(x):
    return float(np.float32(x))


# ---------------------------------------------------------------- Strata -> gguf

def strata_write(path, rng):
    """Writes with Strata; returns (expected metadata {key: (type, elem_type, value)}, tensors)."""
    w = lib.gguf_writer_new()
    exp = {}
    lib.gguf_writer_set_alignment(w, 64)
    exp["general.alignment"] = (VT.UINT32, None, 64)
    lib.gguf_w_u32(w, b"s.u32", 4000000000); exp["s.u32"] = (VT.UINT32, None, 4000000000)
    lib.gguf_w_i32(w, b"s.i32", -77); exp["s.i32"] = (VT.INT32, None, -77)
    lib.gguf_w_u64(w, b"s.u64", 2**63 + 11); exp["s.u64"] = (VT.UINT64, None, 2**63 + 11)
    lib.gguf_w_f32(w, b"s.f32", 0.1); exp["s.f32"] = (VT.FLOAT32, None, f32(0.1))
    lib.gguf_w_bool(w, b"s.bool", 1); exp["s.bool"] = (VT.BOOL, None, True)
    text = "grüße, 世界 ✓"
    lib.gguf_w_str(w, b"s.str", text.encode()); exp["s.str"] = (VT.STRING, None, text)
    for vt, val in [(VT.UINT8, 250), (VT.INT8, -100), (VT.UINT16, 60000), (VT.INT16, -20000),
                    (VT.INT64, -(2**62) - 3), (VT.FLOAT64, 1.0 / 3.0)]:
        key = f"raw.{vt.name.lower()}"
        raw = struct.pack(SCALAR_FMT[vt], val)
        lib.gguf_w_raw(w, key.encode(), int(vt), raw, len(raw))
        exp[key] = (vt, None, val)
    for vt, vals in [(VT.UINT8, [0, 1, 255]), (VT.INT16, [-5, 5]), (VT.UINT32, [1, 2**32 - 1]),
                     (VT.INT32, [-(2**31), 2**31 - 1, 0]), (VT.FLOAT32, [f32(1.5), f32(-0.2)]),
                     (VT.BOOL, [True, False, True]), (VT.UINT64, [2**64 - 1, 0]), (VT.INT64, [-1, 2**40]),
                     (VT.FLOAT64, [1e-300, -2.5])]:
        key = f"arr.{vt.name.lower()}"
        a = np.array(vals, dtype=NP_OF[vt])
        lib.gguf_w_arr(w, key.encode(), int(vt), a.ctypes.data, len(vals))
        exp[key] = (VT.ARRAY, vt, vals)
    strs = ["", "a", "ünïcode", "x" * 300]
    arr = (C.c_char_p * len(strs))(*[s.encode() for s in strs])
    lib.gguf_w_arr_str(w, b"arr.str", arr, len(strs))
    exp["arr.str"] = (VT.ARRAY, VT.STRING, strs)
    # array of arrays of int32, packed by hand per the spec
    nested = [[1, 2, 3], [], [-4]]
    raw = struct.pack("<IQ", VT.ARRAY, len(nested))
    for inner in nested:
        raw += struct.pack("<IQ", VT.INT32, len(inner)) + b"".join(struct.pack("<i", x) for x in inner)
    lib.gguf_w_raw(w, b"arr.nested", int(VT.ARRAY), raw, len(raw))
    exp["arr.nested"] = (VT.ARRAY, VT.ARRAY, nested)

    specs = [("t.f32", QT.F32, [5, 3]), ("t.f16", QT.F16, [16]), ("t.q4_0", QT.Q4_0, [64, 2]),
             ("t.q8_0", QT.Q8_0, [32, 3, 2]), ("t.q4_k", QT.Q4_K, [256, 2, 1, 2]), ("t.i32", QT.I32, [7])]
    tensors = []
    for name, qt, ne in specs:
        blck, tsize = gguf.GGML_QUANT_SIZES[qt]
        nbytes = int(np.prod(ne)) // blck * tsize
        data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        tensors.append((name, qt, ne, data))
        lib.gguf_w_tensor(w, name.encode(), int(qt), len(ne), (C.c_int64 * 4)(*ne))

    @FILL
    def fill(ctx, i, buf, size):
        d = tensors[i][3]
        if size != len(d):
            return -1
        C.memmove(buf, d, size)
        return 0

    rc = lib.gguf_writer_write(w, path.encode(), fill, None)
    lib.gguf_writer_free(w)
    check(rc == 0, f"Strata writer failed: {lib.st_error_get()}")
    return exp, tensors


def reader_value(field):
    """Value of a GGUFReader field as plain Python (nested arrays rebuilt from parts)."""
    t = field.types[0]
    if t != VT.ARRAY:
        v = field.contents()
        return bool(v) if t == VT.BOOL else v
    if len(field.types) > 1 and field.types[1] == VT.ARRAY:
        # GGUFReader flattens nested arrays: parts are
        # [key len, key, type, etype, n, (etype, n, elems...)*]
        out, k = [], 5
        n_outer = int(field.parts[4][0])
        for _ in range(n_outer):
            n = int(field.parts[k + 1][0])
            out.append([x for part in field.parts[k + 2:k + 2 + n] for x in part.tolist()])
            k += 2 + n
        return out
    v = field.contents()
    return [bool(x) for x in v] if field.types[-1] == VT.BOOL else v


def strata_to_gguf(path, rng):
    exp, tensors = strata_write(path, rng)
    r = gguf.GGUFReader(path)
    keys = [f.name for f in r.fields.values() if not f.name.startswith("GGUF.")]
    check(keys == list(exp.keys()), f"key order {keys} != {list(exp.keys())}")
    for key, (t, et, val) in exp.items():
        f = r.fields.get(key)
        check(f is not None, f"gguf reader lacks {key}")
        if f is None:
            continue
        check(f.types[0] == t, f"{key}: type {f.types[0]} != {t}")
        if et is not None:
            check(f.types[1] == et, f"{key}: element type {f.types[1]} != {et}")
        got = reader_value(f)
        check(got == val, f"{key}: {got!r} != {val!r}")
    check(r.alignment == 64, f"alignment {r.alignment}")
    check(len(r.tensors) == len(tensors), "tensor count")
    for rt, (name, qt, ne, data) in zip(r.tensors, tensors):
        check(rt.name == name and rt.tensor_type == qt, f"tensor {rt.name} {rt.tensor_type} != {name} {qt}")
        check(list(rt.shape) == ne, f"{name}: shape {list(rt.shape)} != {ne}")
        check(rt.data.tobytes() == data, f"{name}: data bytes differ")
        check(rt.data_offset % 64 == 0, f"{name}: data offset {rt.data_offset} not 64-aligned")
    print(f"  Strata -> gguf.GGUFReader: {len(exp)} keys (every type, nested arrays) and "
          f"{len(tensors)} tensors ({', '.join(t[1].name for t in tensors)}) equal")


# ---------------------------------------------------------------- gguf -> Strata

def strata_value(v):
    """Reads a value through Strata's accessors (scalars as arrays of one)."""
    def elem(j, et):
        if et == VT.ARRAY:
            e = GgufValue()
            check(lib.gguf_arr_get_value(C.byref(v), j, C.byref(e)) == 0, "arr_get_value")
            return strata_value(e)
        if et == VT.STRING:
            s, n = C.c_char_p(), C.c_uint64()
            check(lib.gguf_arr_get_str(C.byref(v), j, C.byref(s), C.byref(n)) == 0, "arr_get_str")
            return C.string_at(s, n.value).decode()
        if et in (VT.FLOAT32, VT.FLOAT64):
            d = C.c_double()
            check(lib.gguf_arr_get_f64(C.byref(v), j, C.byref(d)) == 0, "arr_get_f64")
            return d.value
        i = C.c_int64()
        if lib.gguf_arr_get_i64(C.byref(v), j, C.byref(i)) == 0:
            return bool(i.value) if et == VT.BOOL else i.value
        check(et == VT.UINT64, "arr_get_i64 refused a small integer")
        return struct.unpack("<Q", C.string_at(v.raw + 8 * j, 8))[0]  # u64 past int64: the raw bytes

    if v.type == VT.ARRAY:
        return [elem(j, VT(v.elem_type)) for j in range(v.n)]
    return elem(0, VT(v.type))


def gguf_to_strata(path, rng):
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(128)
    exp = {"general.architecture": (VT.STRING, "llama"), "general.alignment": (VT.UINT32, 128)}
    for vt, adder, val in [(VT.UINT8, w.add_uint8, 7), (VT.INT8, w.add_int8, -8), (VT.UINT16, w.add_uint16, 65535),
                           (VT.INT16, w.add_int16, -32768), (VT.UINT32, w.add_uint32, 123456789),
                           (VT.INT32, w.add_int32, -123456789), (VT.FLOAT32, w.add_float32, f32(2.5e-3)),
                           (VT.UINT64, w.add_uint64, 2**64 - 2), (VT.INT64, w.add_int64, -(2**63)),
                           (VT.FLOAT64, w.add_float64, 6.02214076e23), (VT.BOOL, w.add_bool, False),
                           (VT.STRING, w.add_string, "tschüß 🙂")]:
        key = f"g.{vt.name.lower()}"
        adder(key, val)
        exp[key] = (vt, val)
    for key, val in [("g.arr_int", [1, -2, 3]), ("g.arr_float", [f32(0.5), f32(-1.25)]),
                     ("g.arr_str", ["alpha", "", "γ"]), ("g.arr_bool", [True, False]),
                     ("g.nested", [[1, 2], [3], [4, 5, 6]]), ("g.nested_str", [["a", "b"], ["c"]]),
                     ("tokenizer.ggml.tokens", [f"tok{i}" for i in range(5000)])]:
        w.add_array(key, val)
        exp[key] = (VT.ARRAY, val)
    arrays = [("w.f32", rng.standard_normal((3, 4)).astype(np.float32), None),
              ("w.f16", rng.standard_normal(64).astype(np.float16), None),
              ("w.i32", rng.integers(-1000, 1000, (2, 5)).astype(np.int32), None),
              ("w.q8_0", rng.integers(0, 256, (2, 3 * 34), dtype=np.uint8), QT.Q8_0),
              ("w.q4_k", rng.integers(0, 256, (4, 144), dtype=np.uint8), QT.Q4_K)]
    for name, a, raw in arrays:
        w.add_tensor(name, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f = lib.gguf_open(path.encode())
    check(bool(f), f"Strata refused the gguf package's file: {lib.st_error_get()}")
    if not f:
        return
    check(lib.gguf_version(f) == 3 and lib.gguf_alignment(f) == 128, "version/alignment")
    n = lib.gguf_n_kv(f)
    check(n == len(exp), f"n_kv {n} != {len(exp)}")
    for key, (t, val) in exp.items():
        i = lib.gguf_find_key(f, key.encode())
        check(i >= 0, f"Strata lacks key {key}")
        if i < 0:
            continue
        v = GgufValue()
        lib.gguf_get_value(f, i, C.byref(v))
        check(v.type == t, f"{key}: type {v.type} != {t}")
        got = strata_value(v)
        check(got == val, f"{key}: {got!r} != {val!r}")
    check(lib.gguf_n_tensors(f) == len(arrays), "tensor count")
    expect_type = {None: None, QT.Q8_0: QT.Q8_0, QT.Q4_K: QT.Q4_K}
    np_type = {np.float32: QT.F32, np.float16: QT.F16, np.int32: QT.I32}
    for i, (name, a, raw) in enumerate(arrays):
        t = lib.gguf_tensor_at(f, i).contents
        qt = expect_type[raw] if raw is not None else np_type[a.dtype.type]
        if raw is None:
            ne = list(reversed(a.shape))
        else:  # raw bytes: the row is bytes // type_size blocks
            blck, tsize = gguf.GGML_QUANT_SIZES[raw]
            ne = [a.shape[-1] // tsize * blck] + list(reversed(a.shape[:-1]))
        check(t.name.decode() == name and t.type == qt, f"tensor {i}: {t.name} {t.type} != {name} {qt}")
        check(list(t.ne[:t.n_dims]) == ne, f"{name}: ne {list(t.ne[:t.n_dims])} != {ne}")
        check(t.size == a.nbytes and C.string_at(t.data, t.size) == a.tobytes(), f"{name}: data bytes differ")
    lib.gguf_close(f)
    print(f"  gguf.GGUFWriter -> Strata: {len(exp)} keys (every type, nested lists, 5000-entry vocab) and "
          f"{len(arrays)} tensors equal")


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    rng = np.random.default_rng(1234)
    strata_to_gguf(os.path.join(work, "py_from_strata.gguf"), rng)
    gguf_to_strata(os.path.join(work, "py_from_gguf.gguf"), rng)
    print(f"test_gguf_py: {checks} checks, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
