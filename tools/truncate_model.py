#!/usr/bin/env python3
"""Write a smaller copy of a GGUF model keeping only some of its layers.

A real model that fits where the full one cannot travel (the GPU device's
64 MiB carry limit): the embeddings, output norm, tokenizer and metadata are
the original's, and layers KEEP (e.g. "0,1,2,27,28,29") are renumbered
0..n-1, with block_count set to n. Its outputs are not the model's, but its
weights, formats and logit scale are real, so it is a fair end-to-end input
for comparing two backends (tests/cuda/test_cuda_e2e.c).

usage: truncate_model.py IN.gguf OUT.gguf KEEP
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType


def main():
    src, dst, keep = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = f.contents()
        if name == f"{arch}.block_count":
            val = len(keep)
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    renum = {old: new for new, old in enumerate(keep)}
    for t in r.tensors:
        name = t.name
        if name.startswith("blk."):
            layer = int(name.split(".")[1])
            if layer not in renum:
                continue
            name = f"blk.{renum[layer]}." + name.split(".", 2)[2]
        # t.data: quantized tensors as their block bytes (numpy shape in bytes), floats as values
        w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
