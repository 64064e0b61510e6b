#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus (tests/fuzz/corpus/): a few tiny valid GGUF
files covering every metadata type, arrays of arrays and several tensor types,
plus a couple of broken ones. Run once; the output is committed (< 200 KB).
Valid files come from the gguf package and from hand packing with struct, so
the seeds do not depend on the code being fuzzed.
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(7)


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, ne, qt, off):
    return s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", qt, off)


def pad(b, a=32):
    return b + b"\0" * ((-len(b)) % a)


def save(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


# 1. from the gguf package: every scalar type, arrays, nested lists, 3 tensors
w = gguf.GGUFWriter(os.path.join(out, "pkg_all_types.gguf"), "llama")
w.add_uint8("a.u8", 1); w.add_int8("a.i8", -1); w.add_uint16("a.u16", 2); w.add_int16("a.i16", -2)
w.add_uint32("a.u32", 3); w.add_int32("a.i32", -3); w.add_float32("a.f32", 0.5); w.add_uint64("a.u64", 4)
w.add_int64("a.i64", -4); w.add_float64("a.f64", 0.25); w.add_bool("a.b", True); w.add_string("a.s", "hi")
w.add_array("a.arr", [1, 2, 3]); w.add_array("a.strs", ["x", "yy"]); w.add_array("a.nest", [[1], [2, 3]])
w.add_tensor("t.f32", rng.standard_normal((2, 4)).astype(np.float32))
w.add_tensor("t.f16", rng.standard_normal(8).astype(np.float16))
w.add_tensor("t.q8_0", rng.integers(0, 256, (1, 34), dtype=np.uint8), raw_dtype=QT.Q8_0)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

# 2. by hand: version 2, alignment 64, nested array of strings, Q4_K tensor
meta = kv("general.alignment", 4, struct.pack("<I", 64))
meta += kv("n.deep", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 8, 2) + s("ab") + s("c"))
meta += kv("n.bools", 9, struct.pack("<IQ", 7, 3) + b"\1\0\1")
head = b"GGUF" + struct.pack("<IQQ", 2, 2, 3) + meta
head += tinfo("blk.0.w", [256], QT.Q4_K, 0) + tinfo("blk.0.b", [4], QT.F32, 192)
body = pad(head, 64) + pad(rng.integers(0, 256, 144, dtype=np.uint8).tobytes(), 64) + b"\0" * 16
save("hand_v2_align64.gguf", body)

# 3. header only, and metadata without tensors
save("empty.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
save("meta_only.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("k", 8, s("v")) + kv("e", 9, struct.pack("<IQ", 0, 0)))

# 4. broken: cut in the middle of the tensor infos; huge array length; v1
good = open(os.path.join(out, "pkg_all_types.gguf"), "rb").read()
save("bad_cut.gguf", good[: len(good) // 2])
save("bad_huge_array.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv("a", 9, struct.pack("<IQ", 4, 1 << 60)))
save("bad_v1.gguf", b"GGUF" + struct.pack("<I", 1) + good[8:64])
total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
print(f"corpus: {len(os.listdir(out))} files, {total} bytes in {out}")
