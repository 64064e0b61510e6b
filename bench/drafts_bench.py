#!/usr/bin/env python3
"""Speculative decoding in `strata serve` (not a test): decode speed with
and without `--draft ngram`, one request at a time and C at once.

    python3 bench/drafts_bench.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 bench/drafts_bench.py -m q35.gguf --completion --bias 40,41,42,43

For each of plain and drafted it starts a server (--slots C, -t THREADS),
sends each prompt alone (R rounds), then all C prompts at once (R rounds),
and stops it. Prompts are code-editing requests (the text repeats what the
prompt holds, which prompt lookup drafts well), as chat messages, or with
--completion as raw completions (for synthetic files, which have no chat
sense). --bias lifts the given token ids by +8 (a random model then repeats
itself, so drafts are made at all). Greedy.

Prints, per configuration: single = the slots' speed lines' decode tok/s
(median over requests) and the server's CPU time per generated token (a
loaded machine stretches wall time much more than CPU time); concurrent = generated tokens of all C requests
over the wall time from sending to the last answer (prompt reading
included); drafts accepted / drafted from the speed lines. Extra serve
options (e.g. --gpu 0) go after `--`."""
import argparse
import os
import re
import statistics
import subprocess
import threading
import time

try:
    import httpx
except ImportError:  # newer SDKs vendor httpx2
    import httpx2 as httpx

PROMPTS = [
    "Rewrite these Python functions with type hints, keeping everything else the same:\n\n"
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n",
    "Rename the variable x to count in this code and change nothing else:\n\n"
    "x = 0\nfor item in items:\n    if item.ok:\n        x = x + 1\nprint(x)\nreturn x\n",
    "Add a docstring to each of these functions, keeping the code as it is:\n\n"
    "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "def is_square(w, h):\n    return w == h\n",
]
SPEED_RE = re.compile(r"(\d+) generated in ([\d.]+) ms \(([\d.]+) tok/s\), drafts accepted (\d+) of (\d+)")


class Serve:
    def __init__(self, args):
        self.lines = []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        ready = threading.Event()
        self.port = None

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(300)
        if self.port is None:
            raise RuntimeError("".join(self.lines[-20:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu_s(self):
        """CPU seconds of the server (and its engine child) so far: load on the machine inflates wall time far more
        than the work done."""
        tot = 0.0
        pids = [self.proc.pid] + [int(p) for p in open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read().split()]
        for pid in pids:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            tot += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        return tot

    def speed_lines(self):
        return [SPEED_RE.search(ln) for ln in self.lines if SPEED_RE.search(ln)]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def request(url, prompt, a):
    if a.completion:
        body = {"prompt": prompt, "max_tokens": a.n, "temperature": 0}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": a.n, "temperature": 0}
        path = "/v1/chat/completions"
    if a.bias:
        body["logit_bias"] = {t: 8 for t in a.bias.split(",")}
    r = httpx.post(url + path, json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def run(a, drafted):
    args = [a.bin, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--slots", str(a.clients), *a.extra]
    if drafted:
        args += ["--draft", "ngram", "--draft-n", str(a.draft_n)]
    s = Serve(args)
    try:
        prompts = PROMPTS[:a.clients] if a.clients <= len(PROMPTS) else PROMPTS * a.clients
        request(s.url, "warm up", a)
        n0 = len(s.speed_lines())
        c0, ntok = s.cpu_s(), 0
        for _ in range(a.rounds):
            for p in prompts[:a.clients]:
                ntok += request(s.url, p, a)
        time.sleep(0.2)
        cpu_single = (s.cpu_s() - c0) / ntok * 1e3
        single = s.speed_lines()[n0:]
        conc = []
        for _ in range(a.rounds):
            toks = [0] * a.clients

            def go(i):
                toks[i] = request(s.url, prompts[i], a)

            t0 = time.time()
            ts = [threading.Thread(target=go, args=(i,)) for i in range(a.clients)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            conc.append(sum(toks) / (time.time() - t0))
        time.sleep(0.2)
        together = s.speed_lines()[n0 + len(single):]
    finally:
        s.stop()

    def acc(lines):
        return sum(int(m.group(4)) for m in lines), sum(int(m.group(5)) for m in lines)

    return statistics.median(float(m.group(3)) for m in single), acc(single), statistics.median(conc), acc(together), \
        cpu_single


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--bin", default="build/bin/strata")
    ap.add_argument("-n", type=int, default=128, help="tokens per answer")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft-n", type=int, default=8)
    ap.add_argument("--completion", action="store_true")
    ap.add_argument("--bias", default="")
    ap.add_argument("--repeat", type=int, default=1, help="alternate plain and drafted servers this many times")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    print(f"| drafts | single tok/s | single CPU ms/token | single accepted | {a.clients} at once tok/s | "
          "at once accepted |")
    print("|---|---|---|---|---|---|")
    res = {False: [], True: []}
    for _ in range(a.repeat):
        for drafted in (False, True):
            s, sa, c, ca, cpu = run(a, drafted)
            res[drafted].append((s, c, cpu))
            name = f"ngram, --draft-n {a.draft_n}" if drafted else "none"
            print(f"| {name} | {s:.1f} | {cpu:.1f} | {sa[0]} of {sa[1]} | {c:.1f} | {ca[0]} of {ca[1]} |", flush=True)
    if a.repeat > 1:
        for drafted in (False, True):
            r = res[drafted]
            print(f"median of {a.repeat}, {'drafted' if drafted else 'plain'}: single "
                  f"{statistics.median(x[0] for x in r):.1f} tok/s ({statistics.median(x[2] for x in r):.1f} CPU ms per "
                  f"token), at once {statistics.median(x[1] for x in r):.1f}")


if __name__ == "__main__":
    main()
