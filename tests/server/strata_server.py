"""Starting a real `strata serve` for the test suites: tests/server (through
conftest.py) and tests/web (which puts this folder on sys.path) share this
one copy.

A Server runs `strata serve -m MODEL --port 0 --ctx 1024 ARGS...` on a free
port of 127.0.0.1, collects its log (stderr) on a thread, and knows the port
from the start line. STRATA_BIN names the strata binary (CTest passes it),
STRATA_MODEL the GGUF (default: models/SmolLM2-135M-Instruct.Q4_1.gguf,
fetched by scripts/fetch-models.sh; a test that needs it skips with a message
when it is missing). STRATA_API_KEY is removed from the server's environment:
a test that wants a key passes --api-key.

stop() is where a sanitizer build is judged: when the log holds an
AddressSanitizer, LeakSanitizer or UndefinedBehaviorSanitizer report (the
engine process shares the server's stderr, so its reports land there too),
stop() raises with the report, so the fixture and the test that stops it fail.
The fixtures also require exit code 0 after SIGTERM.
"""
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

try:  # the HTTP client the SDKs themselves use: httpx, or httpx2 in their newer releases
    import httpx
except ImportError:
    import httpx2 as httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("STRATA_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
BIN = os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "bin", "strata"))
CTX = 1024

# The first line of each kind of sanitizer report (UBSan's are "file:line:col: runtime error: ...").
SANITIZER_RE = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error: |SUMMARY: (Address|Leak|"
                          r"UndefinedBehavior)Sanitizer")


class Server:
    def __init__(self, *args, start_timeout=120, ctx=CTX):
        if not os.path.exists(MODEL):
            pytest.skip(f"SKIPPED: {MODEL} is missing (run scripts/fetch-models.sh)")
        env = {k: v for k, v in os.environ.items() if k != "STRATA_API_KEY"}
        self.args = args
        self.proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "--ctx", str(ctx), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                     errors="replace")
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

        self.drainer = threading.Thread(target=drain, daemon=True)
        self.drainer.start()
        if not ready.wait(start_timeout) or self.port is None:
            self.stop()
            raise RuntimeError("strata serve did not start:\n" + "\n".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def log(self):
        return "\n".join(self.lines)

    def get(self, path, headers=None):
        """(status, headers, text) of a GET, whatever the status."""
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def metrics(self, path="/metrics", headers=None):
        """The Prometheus text as {name{labels}: value}."""
        status, _, text = self.get(path, headers)
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metric(self, key, pred, timeout=10.0, headers=None):
        t0 = time.time()
        while time.time() - t0 < timeout:
            v = self.metrics(headers=headers).get(key)
            if v is not None and pred(v):
                return v
            time.sleep(0.05)
        raise AssertionError(f"{key} never satisfied the condition; last {self.metrics(headers=headers).get(key)}")

    def alive(self):
        return self.proc.poll() is None

    def sanitizer_report(self):
        """The log from the first sanitizer line on, or None."""
        for i, line in enumerate(self.lines):
            if SANITIZER_RE.search(line):
                return "\n".join(self.lines[max(0, i - 2):i + 60])
        return None

    def stop(self):
        """SIGTERM, wait, return the exit code; raises on a sanitizer report."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)  # a sanitizer build checks for leaks on the way out
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError("strata serve did not stop on SIGTERM within 60 s")
        self.drainer.join(10)  # the rest of the log, the engine's included
        report = self.sanitizer_report()
        if report:
            raise AssertionError(f"sanitizer report in the log of strata serve {' '.join(self.args)}:\n{report}")
        return self.proc.returncode
