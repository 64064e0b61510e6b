"""Strata against llama.cpp on the same GGUF (not a ctest: it needs a
llama.cpp build, see llama_logits.c).

llama.cpp reads a prompt and generates N tokens greedily (llama_logits);
Strata's forward_dump then reads the prompt plus those tokens (one call, and
again with --split: half in one call, the rest a token at a time) and the
logits of the same positions are compared: greedy agreement (Strata's argmax
at each step equals llama.cpp's choice), max |diff| / std, and the KL
divergence KL(llama || strata) of the softmaxed logits, mean and max.

    python compare_llama.py LLAMA_LOGITS FORWARD_DUMP MODEL.gguf [N_GEN]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def logsoftmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main(argv):
    llama, dump, model = argv[:3]
    n_gen = int(argv[3]) if len(argv) > 3 else 32
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    with tempfile.TemporaryDirectory() as d:
        lf = os.path.join(d, "llama.bin")
        r = subprocess.run([llama, model, lf, str(n_gen), ",".join(map(str, prompt))], capture_output=True,
                           text=True, check=True)
        gen = [int(t) for t in r.stdout.strip().split(",")]
        ll = np.fromfile(lf, dtype=np.float32).reshape(n_gen + 1, -1).astype(np.float64)[:n_gen]
        toks = prompt + gen[:-1]  # positions whose next-token logits llama.cpp gave
        res = {}
        for mode in ("one call", "split"):
            sf = os.path.join(d, "strata.bin")
            cmd = [dump, model, sf, "--tokens", ",".join(map(str, toks)), "--threads", "2", "--ctx", "64"]
            if mode == "split":
                cmd.append("--split")
            subprocess.run(cmd, capture_output=True, text=True, check=True)
            st = np.fromfile(sf, dtype=np.float32).reshape(len(toks), -1).astype(np.float64)[len(prompt) - 1:]
            agree = int((st.argmax(1) == np.array(gen)).sum())
            first = next((i for i in range(n_gen) if st[i].argmax() != gen[i]), None)
            lp, ls = logsoftmax(ll), logsoftmax(st)
            kl = (np.exp(lp) * (lp - ls)).sum(1)
            err = np.abs(st - ll).max() / ll.std()
            res[mode] = (agree, first, kl.mean(), kl.max(), err)
            print(f"{os.path.basename(model)} [{mode}]: greedy {agree}/{n_gen} equal"
                  f"{'' if first is None else f' (first difference at step {first})'}, "
                  f"KL mean {kl.mean():.2e} max {kl.max():.2e}, max|diff|/std {err:.2e}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
