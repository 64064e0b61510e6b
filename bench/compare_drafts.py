#!/usr/bin/env python3
"""Speculative decoding side by side (not a test): `strata serve` and
llama.cpp's `llama-server` on one GGUF, one request at a time, with no
drafts, n-gram drafts and MTP drafts, and the ratio of their decode speeds.

    python3 bench/compare_drafts.py --strata build/bin/strata --llama peers/lbc/bin/llama-server \\
        -m q35-mtp.gguf --bias 40,41,42,43 -- --gpu 0

Each (engine, drafts) pair gets a server of its own: a warm-up request, then
ROUNDS x the three code-editing prompts of bench/drafts_bench.py as raw
completions (`/v1/completions`: synthetic files have no chat sense), greedy,
N tokens each, EOS ignored. --bias lifts the given token ids by +8 in both
(a random model then repeats itself, so n-gram drafts are made at all, and
a random MTP block's guesses, where the drafts see the bias, are sometimes
right). Decode tok/s is each engine's own figure for the generated tokens
(Strata: its speed line; llama.cpp: `timings.predicted_per_second`),
median over the requests; drafts accepted / drafted are their counters
(Strata's speed line; llama.cpp's `timings.draft_n_accepted` / `draft_n`).

Drafts: Strata `--draft ngram|mtp --draft-n D`; llama.cpp `--spec-type
ngram-simple|ngram-mod|draft-mtp --spec-draft-n-max D` (MTP read from the
same file). llama-server runs with every layer on the GPU (-ngl 99), flash
attention, one slot. Strata's extra options (e.g. --gpu 0) go after `--`.
Standard library only (the GPU machine has no httpx)."""
import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = None  # bench/drafts_bench.py's, read below without importing it (it needs httpx)
SPEED_RE = re.compile(r"(\d+) generated in ([\d.]+) ms \(([\d.]+) tok/s\), drafts accepted (\d+) of (\d+)")


def load_prompts():
    src = open(__file__.rsplit("/", 1)[0] + "/drafts_bench.py").read()
    block = src[src.index("PROMPTS = ["):src.index("]\n", src.index("PROMPTS = [")) + 1]
    scope = {}
    exec(block, scope)  # the list literal only
    return scope["PROMPTS"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


class Server:
    """One server process; its stderr lines are kept (Strata's speed lines are there)."""

    def __init__(self, args, port):
        self.lines, self.url = [], f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
        t0 = time.time()
        while time.time() - t0 < 600:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{args[0]} ended (rc {self.proc.returncode}): " + "".join(self.lines[-15:]))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.load_s = time.time() - t0
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("no /health answer in 600 s: " + "".join(self.lines[-15:]))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run(a, engine, drafts):
    port = free_port()
    if engine == "strata":
        args = [a.strata, "serve", "-m", a.model, "--port", str(port), "--slots", "1", "--ctx", str(a.ctx), *a.extra]
        if drafts != "none":
            args += ["--draft", drafts, "--draft-n", str(a.draft_n)]
    else:
        args = [a.llama, "-m", a.model, "--port", str(port), "-ngl", "99", "-fa", "on", "-c", str(a.ctx), "-np", "1",
                "--no-webui"]
        if drafts != "none":
            args += ["--spec-type", {"ngram": a.llama_ngram, "mtp": "draft-mtp"}[drafts], "--spec-draft-n-max",
                     str(a.draft_n)]
    s = Server(args, port)
    speeds, acc, tot, ntok = [], 0, 0, 0
    try:
        body = {"max_tokens": a.n, "temperature": 0, "ignore_eos": True}
        if a.bias:
            body["logit_bias"] = {t: 8 for t in a.bias.split(",")}
        post(s.url + "/v1/completions", {**body, "prompt": "warm up", "max_tokens": 8})
        for _ in range(a.rounds):
            for p in PROMPTS:
                n0 = len(s.lines)
                r = post(s.url + "/v1/completions", {**body, "prompt": p})
                ntok += r["usage"]["completion_tokens"]
                if engine == "strata":
                    time.sleep(0.1)  # the speed line follows the answer
                    m = next((SPEED_RE.search(ln) for ln in s.lines[n0:] if SPEED_RE.search(ln)), None)
                    if m is None:
                        raise RuntimeError("no speed line: " + "".join(s.lines[-5:]))
                    speeds.append(float(m.group(3)))
                    acc, tot = acc + int(m.group(4)), tot + int(m.group(5))
                else:
                    t = r["timings"]
                    speeds.append(t["predicted_per_second"])
                    acc, tot = acc + t.get("draft_n_accepted", 0), tot + t.get("draft_n", 0)
    finally:
        s.stop()
    return statistics.median(speeds), min(speeds), max(speeds), acc, tot, ntok, s.load_s


def main():
    global PROMPTS
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--strata", default="build/bin/strata")
    ap.add_argument("--llama", default="", help="llama-server binary (without it, Strata only)")
    ap.add_argument("--llama-ngram", default="ngram-simple", help="llama.cpp's n-gram draft type")
    ap.add_argument("-n", type=int, default=128, help="tokens per answer")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft-n", type=int, default=4)
    ap.add_argument("--bias", default="")
    ap.add_argument("--drafts", default="none,ngram,mtp")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    PROMPTS = load_prompts()
    engines = ["strata"] + (["llama"] if a.llama else [])
    print(f"model {a.model}, {a.n} tokens x {len(PROMPTS)} prompts x {a.rounds} rounds, draft-n {a.draft_n}, "
          f"bias {a.bias or 'none'}")
    print("| drafts | engine | decode tok/s (median, min-max) | drafts accepted | tokens | load s |")
    print("|---|---|---|---|---|---|")
    res = {}
    for d in a.drafts.split(","):
        for e in engines:
            try:
                med, lo, hi, acc, tot, ntok, load = run(a, e, d)
            except (RuntimeError, OSError, KeyError) as ex:
                print(f"| {d} | {e} | failed: {str(ex)[-300:]!r} | | | |", flush=True)
                continue
            res[(d, e)] = med
            rate = f"{acc} of {tot} ({100.0 * acc / tot:.0f}%)" if tot else "0 of 0"
            print(f"| {d} | {e} | {med:.1f} ({lo:.1f}-{hi:.1f}) | {rate} | {ntok} | {load:.1f} |", flush=True)
    for d in a.drafts.split(","):
        if (d, "strata") in res and (d, "llama") in res:
            print(f"{d}: Strata / llama.cpp {res[(d, 'strata')] / res[(d, 'llama')]:.2f}x")
    for e in engines:
        if ("none", e) in res:
            gains = [f"{d} {res[(d, e)] / res[('none', e)]:.2f}x" for d in a.drafts.split(",") if d != "none" and
                     (d, e) in res]
            print(f"{e}: drafts against none: {', '.join(gains)}")


if __name__ == "__main__":
    main()
