"""Strata's MTP drafts against llama.cpp's on the same GGUF (not a ctest: it
needs llama.cpp's llama-server, the b11434 CPU build in peers/).

llama-server runs the file with `--spec-type draft-mtp` (its MTP context on
the main model's nextn block), drafts of K tokens with no confidence cut
(`--spec-draft-p-min 0`), and answers one greedy /completion of N tokens
after a prompt of token ids. Its verbose log names every draft: each step's
candidates (the first is the drafted token), then the verify batch
(`generate_draft: ... pos_next=P`: the pending token sits at position P).
For each of those drafts, mtp_dump reads the same tokens (the prompt and
the tokens generated before P) into Strata and drafts K tokens after the
token at P (engine_seq_draft_mtp); the two chains are compared token by
token up to their first difference (a later step reads the earlier
guess). Also printed: llama.cpp's acceptance (its timings) and whether its
greedy tokens are Strata's (forward_dump's argmax after the same tokens).

    python compare_llama_mtp.py LLAMA_SERVER MTP_DUMP FORWARD_DUMP MODEL.gguf [N_GEN] [K]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

PORT = 18777


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait_ready(proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("llama-server exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not start")


def llama_drafts(log):
    """[(pos_next, [drafted tokens])] in order, from the verbose log."""
    out, cur = [], []
    for line in log.splitlines():
        m = re.search(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)", line)
        if m:
            cur.append(int(m.group(2)))
            continue
        m = re.search(r"generate_draft:.*#draft=(\d+), pos_next=(\d+)", line)
        if m:
            n = int(m.group(1))
            out.append((int(m.group(2)), cur[:n]))
            cur = []
    return out


def main(argv):
    server, mtp_dump, fwd_dump, model = argv[:4]
    n_gen = int(argv[4]) if len(argv) > 4 else 24
    k = int(argv[5]) if len(argv) > 5 else 4
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, 400, 16)]
    with tempfile.TemporaryDirectory() as d:
        logf = open(os.path.join(d, "server.log"), "w")
        proc = subprocess.Popen([server, "-m", model, "--port", str(PORT), "-t", "2", "-c", "256", "-np", "1",
                                 "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
                                 "--spec-draft-p-min", "0", "-v"], stdout=logf, stderr=subprocess.STDOUT)
        try:
            wait_ready(proc)
            r = post("/completion", {"prompt": prompt, "n_predict": n_gen, "temperature": 0, "top_k": 1,
                                     "cache_prompt": False, "return_tokens": True})
        finally:
            proc.terminate()
            proc.wait()
            logf.close()
        log = open(os.path.join(d, "server.log")).read()
        gen = r["tokens"]
        t = r.get("timings", {})
        print(f"llama.cpp: prompt {t.get('prompt_n')} tokens, {len(gen)} generated, drafts accepted "
              f"{t.get('draft_n_accepted')} of {t.get('draft_n')}")
        seq = prompt + gen
        # Strata's greedy choice after the same tokens (the main model)
        sf = os.path.join(d, "f.bin")
        subprocess.run([fwd_dump, model, sf, "--tokens", ",".join(map(str, seq[:-1])), "--threads", "2"],
                       check=True, capture_output=True, env=dict(os.environ, STRATA_PRECISE="1"))
        st = np.fromfile(sf, dtype=np.float32).reshape(len(seq) - 1, -1)[len(prompt) - 1:]
        print(f"greedy tokens: Strata's argmax equals llama.cpp's choice at {int((st.argmax(1) == gen).sum())} of "
              f"{len(gen)} steps")
        drafts = llama_drafts(log)
        same = steps = chains = whole = 0
        for pos, ld in drafts:
            if not ld or pos >= len(seq):
                continue
            of = os.path.join(d, "m.bin")
            subprocess.run([mtp_dump, model, of, "--tokens", ",".join(map(str, seq[:pos])), "--draft",
                            f"{seq[pos]},{len(ld)}"], check=True, capture_output=True,
                           env=dict(os.environ, STRATA_PRECISE="1"))
            sd = np.fromfile(of + ".drafts", dtype=np.int32).tolist()
            n_eq = next((i for i in range(len(ld)) if sd[i] != ld[i]), len(ld))
            chains += 1
            whole += n_eq == len(ld)
            same += n_eq
            steps += min(n_eq + 1, len(ld))
            print(f"  pending at {pos}: llama.cpp {ld}, Strata {sd}{'' if n_eq == len(ld) else f' (differ at {n_eq})'}")
        print(f"MTP drafts: {chains} chains, {whole} equal whole; {same} of {steps} compared steps equal")
    return chains, whole


if __name__ == "__main__":
    main(sys.argv[1:])
