"""Strata's MTP block and drafts against llama.cpp's on the same GGUF (not a
ctest: it needs llama_mtp.cpp built against a llama.cpp build; see there).

For a few random prompts of N tokens and a pending token, llama_mtp runs
llama.cpp's target and MTP contexts the way its draft-mtp driver does and
writes the block's logits at every prompt position and the K tokens it
drafts after the pending one; mtp_dump does the same in Strata
(engine_seq_mtp_logits, engine_seq_draft_mtp; f32 activations,
STRATA_PRECISE=1, unless PRECISE=0 is in the environment: then 8-bit ones,
as llama.cpp's CPU products quantize theirs). Printed: max|diff| / std of the logits, top-1 agreement, and
whether the drafted tokens are equal.

    python compare_llama_mtp.py LLAMA_MTP MTP_DUMP MODEL.gguf [N_TOK] [K]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def main(argv):
    llama, dump, model = argv[:3]
    n = int(argv[3]) if len(argv) > 3 else 24
    k = int(argv[4]) if len(argv) > 4 else 4
    res = []
    with tempfile.TemporaryDirectory() as d:
        for seed in (4321, 1, 2):
            rng = np.random.default_rng(seed)
            toks = [int(t) for t in rng.integers(0, 400, n)]
            pending = int(rng.integers(0, 400))
            lf, sf = os.path.join(d, "l.bin"), os.path.join(d, "s.bin")
            r = subprocess.run([llama, model, lf, str(k), str(pending), ",".join(map(str, toks))], capture_output=True,
                               text=True, check=True)
            ld = [int(x) for x in r.stdout.strip().split(",")]
            subprocess.run([dump, model, sf, "--tokens", ",".join(map(str, toks)), "--draft", f"{pending},{k}"],
                           capture_output=True, text=True, check=True,
                           env=dict(os.environ, STRATA_PRECISE=os.environ.get("PRECISE", "1")))
            sd = np.fromfile(sf + ".drafts", dtype=np.int32).tolist()
            ll = np.fromfile(lf, dtype=np.float32).reshape(n, -1).astype(np.float64)
            st = np.fromfile(sf, dtype=np.float32).reshape(n, -1).astype(np.float64)
            err = float(np.abs(st - ll).max() / ll.std())
            agree = int((st.argmax(1) == ll.argmax(1)).sum())
            res.append((err, agree, ld == sd))
            print(f"{os.path.basename(model)} prompt {seed}: MTP logits max|diff|/std {err:.2e}, top-1 {agree}/{n}; "
                  f"drafts after {pending}: llama.cpp {ld}, Strata {sd} ({'equal' if ld == sd else 'DIFFER'})")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
