#!/usr/bin/env python3
"""Load benchmark for an OpenAI-compatible server (not a test): C concurrent
streaming clients x R requests each, standard library only (so it runs on the
GPU machine, which has no pip). Against `strata serve` a poller reads /metrics
and checks that busy slots never exceed the slot count; against another server
(llama-server) that check is skipped when /metrics has no strata_slots_busy.

    strata serve --slots 4 --port 8080 &
    python3 bench/load_server.py --url http://127.0.0.1:8080 --clients 16 --requests 50 --max-tokens 16

Prints: failed requests, the highest strata_slots_busy seen vs
strata_slots_total, time to first token p50/p99, request latency p50/p99,
and aggregate generated tokens per second (usage completion tokens over the
wall time of the run); --json adds one line of those figures for scripts.
Exit code 1 on any failure or a slot-limit breach."""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def connect(url, timeout):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def metrics(conn):
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    out = {}
    if r.status != 200:
        return out
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def stream_one(conn, body):
    """One streamed chat completion: (seconds to the first content, completion tokens), or raises."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    first, n_tok, done = None, 0, False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        d = json.loads(line[6:])
        if "error" in d:
            raise RuntimeError(str(d["error"]))
        if d.get("usage"):
            n_tok = d["usage"]["completion_tokens"]
        if first is None and d.get("choices") and d["choices"][0].get("delta", {}).get("content"):
            first = time.perf_counter() - t0
    r.read()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return first, n_tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every answer runs to --max-tokens (llama-server's ignore_eos): decode throughput, not prompts")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--tag", default="", help="words put in every prompt (a warm-up with another tag leaves "
                    "nothing of the measured prompts in the servers' prefix caches)")
    a = ap.parse_args()

    ttft, lat, fails, gen = [], [], [], [0]
    lock = threading.Lock()
    stop = threading.Event()
    peak = [0.0, 0.0, False]  # busy, total, whether the server reports them

    def poll():
        conn = connect(a.url, 10)
        while not stop.is_set():
            m = metrics(conn)
            if "strata_slots_busy" not in m:
                return  # not strata: no slot count to check
            peak[0] = max(peak[0], m["strata_slots_busy"])
            peak[1] = m["strata_slots_total"]
            peak[2] = True
            time.sleep(0.02)

    def client(ci):
        conn = connect(a.url, 600)
        for ri in range(a.requests):
            text = f"{a.tag} client {ci} request {ri}: say something short.".strip()
            body = {"messages": [{"role": "user", "content": text}],
                    "max_tokens": a.max_tokens, "temperature": a.temperature, "seed": ci * 1000 + ri,
                    "stream": True, "stream_options": {"include_usage": True}}
            if a.ignore_eos:
                body["ignore_eos"] = True
            t0 = time.perf_counter()
            try:
                first, n_tok = stream_one(conn, body)
            except Exception as e:  # noqa: BLE001 - every failure is counted and printed
                with lock:
                    fails.append(f"client {ci} request {ri}: {e}")
                conn.close()
                conn = connect(a.url, 600)
                continue
            with lock:
                lat.append(time.perf_counter() - t0)
                if first is not None:
                    ttft.append(first)
                gen[0] += n_tok
        conn.close()

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
    if peak[2]:
        print(f"slots busy: peak {peak[0]:.0f} of {peak[1]:.0f}")
    print(f"time to first token: p50 {pct(ttft, 50) * 1e3:.0f} ms, p99 {pct(ttft, 99) * 1e3:.0f} ms")
    print(f"request latency: p50 {pct(lat, 50) * 1e3:.0f} ms, p99 {pct(lat, 99) * 1e3:.0f} ms")
    print(f"aggregate generation: {gen[0]} tokens in {wall:.1f} s = {gen[0] / wall:.1f} tok/s")
    if a.json:
        print("json " + json.dumps({"clients": a.clients, "ok": total - len(fails), "failed": len(fails),
                                    "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
                                    "tokens": gen[0], "wall_s": wall, "tok_s": gen[0] / wall}))
    bad = bool(fails) or peak[0] > peak[1]
    if peak[0] > peak[1]:
        print("FAIL: more busy slots than slots")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
