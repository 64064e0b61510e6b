"""Fixtures for the server tests: a real `strata serve` on a free port of
127.0.0.1 with the real default model, its log collected on a thread (the
speed lines are checked), and clients from the official openai / anthropic
SDKs pointed at it.

STRATA_BIN names the strata binary (CTest passes it), STRATA_MODEL the GGUF
(default: models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by
scripts/fetch-models.sh; the tests skip with a message when it is missing).
"""
import os
import re
import subprocess
import threading
import time

import pytest

try:  # the HTTP client the SDKs themselves use: httpx, or httpx2 in their newer releases
    import httpx
except ImportError:
    import httpx2 as httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("STRATA_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
BIN = os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "bin", "strata"))
CTX = 1024


class Server:
    def __init__(self, *args):
        if not os.path.exists(MODEL):
            pytest.skip(f"SKIPPED: {MODEL} is missing (run scripts/fetch-models.sh)")
        self.proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "--ctx", str(CTX), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(60) or self.port is None:
            self.stop()
            raise RuntimeError("strata serve did not start:\n" + "\n".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def log(self):
        return "\n".join(self.lines)

    def metrics(self, headers=None):
        """The Prometheus text as {name{labels}: value}."""
        r = httpx.get(self.url + "/metrics", headers=headers or {})
        assert r.status_code == 200, r.text
        out = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metric(self, key, pred, timeout=10.0, headers=None):
        t0 = time.time()
        while time.time() - t0 < timeout:
            v = self.metrics(headers).get(key)
            if v is not None and pred(v):
                return v
            time.sleep(0.05)
        raise AssertionError(f"{key} never satisfied the condition; last {self.metrics(headers).get(key)}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise AssertionError("strata serve did not stop on SIGTERM within 20 s")
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--slots", "2")
    yield s
    rc = s.stop()
    assert rc == 0, f"strata serve exited with {rc}\n{s.log()[-3000:]}"


@pytest.fixture(scope="session")
def oai(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def anth(server):
    import anthropic
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
