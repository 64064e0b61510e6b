#!/usr/bin/env python3
"""Record reference outputs of the transformers implementation of a real
model, loaded from the same GGUF file Strata runs, as a committed fixture.

transformers dequantizes the GGUF weights to float32 and runs its own
modelling code, so the fixture is independent of Strata's loader, kernels and
tokenizer. Recorded per model:
  - 5 fixed prompts: their token ids and a 32-token greedy continuation, with
    the gap between the best and second-best logit at every step (a small gap
    is a near-tie, where a different engine may legitimately diverge);
  - teacher forcing over a text of >= 1000 tokens: the argmax and top-2 gap
    at every position.
Token ids come from transformers' own tokenizer, so the comparison of the
forward pass does not depend on Strata's tokenizer (tested on its own).

Needs torch, transformers, gguf (not part of the test run; the fixtures are
committed). Usage: make_hf_reference.py MODEL.gguf OUT.json TEXTFILE
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
]
N_GREEDY = 32
N_TF = 1000


def main():
    path, out, text_path = sys.argv[1], sys.argv[2], sys.argv[3]
    d, f = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    model.eval()
    rec = {"model": f, "transformers": __import__("transformers").__version__, "prompts": [], "tf": {}}
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, add_special_tokens=True)["input_ids"]
            seq = list(ids)
            gen, gaps = [], []
            for _ in range(N_GREEDY):
                logits = model(torch.tensor([seq])).logits[0, -1].double()
                top = torch.topk(logits, 2)
                t = int(top.indices[0])
                gen.append(t)
                gaps.append(float(top.values[0] - top.values[1]))
                seq.append(t)
            rec["prompts"].append({"text": p, "ids": ids, "greedy": gen, "gaps": gaps})
            print(p, "->", repr(tok.decode(gen)), file=sys.stderr)
        text = open(text_path, encoding="utf-8").read()
        ids = tok(text, add_special_tokens=True)["input_ids"][: N_TF + 1]
        assert len(ids) == N_TF + 1, f"text too short: {len(ids)} tokens"
        logits = model(torch.tensor([ids])).logits[0].double()
        top = torch.topk(logits, 2, dim=-1)
        rec["tf"] = {
            "ids": ids,
            "argmax": [int(x) for x in top.indices[:N_TF, 0]],
            "gaps": [float(x) for x in (top.values[:N_TF, 0] - top.values[:N_TF, 1])],
        }
    with open(out, "w") as fo:
        json.dump(rec, fo, separators=(",", ":"))
        fo.write("\n")


if __name__ == "__main__":
    main()
