#!/usr/bin/env python3
"""KL divergence and top-1 agreement between two llama.cpp --kl-divergence-base
files, computed in NumPy from the files alone (format: src/cli/ppl_kld.h).

usage: bench/kld_files.py A.kld B.kld

Prints KLD(A || B) and KLD(B || A) with llama.cpp's definition (the sum over
tokens whose log-probability in the first file is above -16) and the share of
positions whose argmax agrees. When A is llama.cpp's file and B Strata's,
Strata reading A prints the first figure and llama.cpp reading B the second,
each from its own full-precision logits; agreement to ~1e-6 (the 16-bit
rounding of the second file) shows that both programs compute the same
statistic. The files must hold the same tokens.
"""
import struct
import sys

import numpy as np


def load(path):
    b = open(path, "rb").read()
    if b[:8] != b"_logits_":
        sys.exit(f"{path}: not a --kl-divergence-base file")
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", b, 8)
    nv, rows = 2 * ((n_vocab + 1) // 2) + 4, n_ctx - 1 - n_ctx // 2
    off = 20 + 4 * n_ctx * n_chunk
    if len(b) != off + 2 * n_chunk * rows * nv:
        sys.exit(f"{path}: size does not match its header")
    tokens = np.frombuffer(b, "<i4", n_ctx * n_chunk, 20)
    u16 = np.frombuffer(b, "<u2", n_chunk * rows * nv, off).reshape(-1, nv)
    head = np.frombuffer(u16[:, :4].tobytes(), "<f4").reshape(-1, 2)
    return tokens, u16[:, 4:4 + n_vocab], head


def logp(q, head, i):
    return head[i, 0] * q[i].astype(np.float32) + head[i, 1]


def compare(qa, ha, qb, hb):
    kld, same = 0.0, 0
    for i in range(qa.shape[0]):  # row by row: Gemma's rows are 262k wide
        a, b = logp(qa, ha, i), logp(qb, hb, i)
        keep = a > -16
        kld += float(np.sum(np.exp(a[keep]) * (a[keep] - b[keep])))
        same += int(a.argmax() == b.argmax())
    return kld / qa.shape[0], 100.0 * same / qa.shape[0]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ta, qa, ha = load(sys.argv[1])
    tb, qb, hb = load(sys.argv[2])
    if ta.shape != tb.shape or (ta != tb).any() or qa.shape != qb.shape:
        sys.exit("the two files hold different tokens or vocabularies")
    for name, args in (("A || B", (qa, ha, qb, hb)), ("B || A", (qb, hb, qa, ha))):
        k, t = compare(*args)
        print(f"files: KLD({name}) = {k:.6f}, same top {t:.3f} % ({qa.shape[0]} positions)")


if __name__ == "__main__":
    main()
