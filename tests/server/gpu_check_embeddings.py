"""GPU check of embeddings (not collected by pytest: it needs a CUDA build and a GPU).

    STRATA_BIN=build-cuda/bin/strata python3 tests/server/gpu_check_embeddings.py

starts the same binary twice on the default model, on the CPU and with --gpu 0, and compares the vectors of
inputs that take the step's different paths: one token (a one-row step, the size the decode graph records),
a sentence, and about 1500 tokens (several --prefill chunks), pooled and per token. The GPU's products round
differently from the CPU's, so the bar is a cosine of at least 0.999 per vector; it prints each one."""
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from strata_server import Server, httpx  # noqa: E402

INPUTS = [[1], "The cat sat on the mat.", "Once upon a time there was a dragon. " * 160]


def vectors(server):
    out = []
    for body in ({"input": INPUTS}, {"content": INPUTS[1], "pooling": "none"}):
        path = "/v1/embeddings" if "input" in body else "/embedding"
        r = httpx.post(server.url + path, json=body, timeout=300)
        assert r.status_code == 200, r.text
        j = r.json()
        out += [d["embedding"] for d in j["data"]] if "data" in j else j[0]["embedding"]
    return np.array(out, dtype=np.float64)


def main():
    cpu = Server("--ctx", "2048")
    try:
        a = vectors(cpu)
    finally:
        cpu.stop()
    gpu = Server("--ctx", "2048", "--gpu", "0")
    try:
        b = vectors(gpu)
    finally:
        gpu.stop()
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print("cosine CPU/GPU per vector:", np.round(cos, 6).tolist())
    if cos.min() < 0.999:
        print("FAIL: a vector differs beyond 0.999")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
