#!/usr/bin/env python3
"""Load benchmark for `strata serve` (not a test): C concurrent streaming
clients x R requests each against a running server, while a poller reads
/metrics and checks that busy slots never exceed the server's slot count.

    strata serve --slots 4 --port 8080 &
    python3 bench/load_server.py --url http://127.0.0.1:8080 --clients 16 --requests 50 --max-tokens 16

Prints: failed requests, the highest strata_slots_busy seen vs
strata_slots_total, time to first token p50/p99, request latency p50/p99,
and aggregate generated tokens per second (usage completion tokens over the
wall time of the run). Exit code 1 on any failure or a slot-limit breach."""
import argparse
import json
import statistics
import threading
import time

try:
    import httpx
except ImportError:  # newer SDKs vendor httpx2
    import httpx2 as httpx


def metrics(client, url):
    out = {}
    for line in client.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every answer runs to --max-tokens (llama-server's ignore_eos): decode throughput, not prompts")
    a = ap.parse_args()

    ttft, lat, fails, gen = [], [], [], [0]
    lock = threading.Lock()
    stop = threading.Event()
    peak = [0.0, 0.0]  # busy, total

    def poll():
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                m = metrics(c, a.url)
                peak[0] = max(peak[0], m["strata_slots_busy"])
                peak[1] = m["strata_slots_total"]
                time.sleep(0.02)

    def client(ci):
        with httpx.Client(timeout=300) as c:
            for ri in range(a.requests):
                body = {"messages": [{"role": "user", "content": f"Client {ci} request {ri}: say something short."}],
                        "max_tokens": a.max_tokens, "temperature": 0.7, "seed": ci * 1000 + ri, "stream": True,
                        "stream_options": {"include_usage": True}}
                if a.ignore_eos:
                    body["ignore_eos"] = True
                t0 = time.perf_counter()
                first, n_tok, ok = None, 0, False
                try:
                    with c.stream("POST", a.url + "/v1/chat/completions", json=body) as r:
                        if r.status_code != 200:
                            raise RuntimeError(f"status {r.status_code}: {r.read()[:200]!r}")
                        for line in r.iter_lines():
                            if not line.startswith("data: "):
                                continue
                            if line == "data: [DONE]":
                                ok = True
                                break
                            d = json.loads(line[6:])
                            if "error" in d:
                                raise RuntimeError(str(d["error"]))
                            if d.get("usage"):
                                n_tok = d["usage"]["completion_tokens"]
                            if first is None and d["choices"] and d["choices"][0]["delta"].get("content"):
                                first = time.perf_counter() - t0
                    if not ok:
                        raise RuntimeError("stream ended without [DONE]")
                except Exception as e:  # noqa: BLE001 - every failure is counted and printed
                    with lock:
                        fails.append(f"client {ci} request {ri}: {e}")
                    continue
                with lock:
                    lat.append(time.perf_counter() - t0)
                    if first is not None:
                        ttft.append(first)
                    gen[0] += n_tok

    p = threading.Thread(target=poll, daemon=True)
    p.start()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    p.join()

    def pct(xs, q):
        return statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))

    total = a.clients * a.requests
    print(f"requests: {total - len(fails)}/{total} ok, {len(fails)} failed; wall {wall:.1f} s")
    for f in fails[:5]:
        print("  FAILED", f)
    print(f"slots busy: peak {peak[0]:.0f} of {peak[1]:.0f}")
    print(f"time to first token: p50 {pct(ttft, 50) * 1e3:.0f} ms, p99 {pct(ttft, 99) * 1e3:.0f} ms")
    print(f"request latency: p50 {pct(lat, 50) * 1e3:.0f} ms, p99 {pct(lat, 99) * 1e3:.0f} ms")
    print(f"aggregate generation: {gen[0]} tokens in {wall:.1f} s = {gen[0] / wall:.1f} tok/s")
    bad = bool(fails) or peak[0] > peak[1]
    if peak[0] > peak[1]:
        print("FAIL: more busy slots than slots")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
