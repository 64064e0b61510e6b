"""A model's layers split across two MPI ranks on the CPU (docs/multi.md).

Runs STRATA_BIN under STRATA_MPIRUN (`mpirun --oversubscribe -n 2`: two
ranks on CI's two cores are fine) and checks what the split must keep:

- greedy tokens equal the one-process run's: a `strata synth --preset tiny`
  file (2 layers, one per rank) and SmolLM2-135M (30 layers; skips without
  models/), with the default split by bytes and an uneven --layer-split, and
  prompts longer than --prefill so that prompt chunks cross the ranks too,
  and in pipelined windows (--pipeline-windows);
  with --draft ngram (batched verification, rejected rows) as well;
- a --layer-split that does not fit the job is refused with a message on
  every rank, and the job ends (no rank left waiting);
- `strata serve` under mpirun answers the one-process server's greedy text;
- two slots decoding together (batched steps carry both sequences);
- the second rank killed with SIGKILL mid-request: the request in flight gets
  HTTP 503 (the engine stopped), and the whole job ends (mpirun stops every
  rank) within a bound; the engine process (the job's rank 0) killed: 503,
  the server stops and exits nonzero, and mpirun ends the rest; nothing hangs;
- `serve --ranks 2` (the server launches the job itself): rank 1 killed gives
  503, and the next request starts a new job that answers the same text.

Everything SKIPs with a message when mpirun is missing or the build has no
STRATA_MPI. Every subprocess has a timeout: a hang fails, it does not stall CI.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

BIN = os.environ.get("STRATA_BIN", "strata")
TMP = Path(os.environ.get("STRATA_TMP", "/tmp"))
ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MPIRUN = os.environ.get("STRATA_MPIRUN") or shutil.which("mpirun") or ""
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away, there lived a"

def why_skip():
    if os.environ.get("STRATA_MPI_BUILD", "ON").upper() in ("OFF", "0", "FALSE", ""):
        return "SKIPPED: this build has no STRATA_MPI (install libopenmpi-dev and configure again)"
    if not MPIRUN or not shutil.which(MPIRUN):
        return "SKIPPED: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    return None


# every test skips (collected, so the run passes) where there is no MPI to run
pytestmark = pytest.mark.skipif(why_skip() is not None, reason=str(why_skip()))
need_smol = pytest.mark.skipif(not SMOL.exists(), reason=f"{SMOL} missing (scripts/fetch-models.sh)")

# Open MPI refuses root unless told; CI containers run as root
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
ENV.pop("STRATA_API_KEY", None)


def mpi(n):
    return [MPIRUN, "--oversubscribe", "-n", str(n)]


def run(cmd, timeout=120):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=ENV,
                       errors="replace")
    assert r.returncode >= 0, f"{' '.join(map(str, cmd))} died by signal {-r.returncode}:\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def tiny():
    path = TMP / "mpi-tiny.gguf"
    r = run([BIN, "synth", "--preset", "tiny", "-o", path, "--quiet"])
    assert r.returncode == 0, r.stderr
    return path


def greedy(model, *extra, ranks=1, n=24, prompt=PROMPT):
    """(stdout, stderr) of a greedy strata run, in one process or under mpirun."""
    cmd = [BIN, "run", "-m", model, "-p", prompt, "-n", n, "--temp", "0", "-t", "1", *extra]
    r = run(mpi(ranks) + cmd if ranks > 1 else cmd)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def ranges(stderr):
    """{rank: (first layer, last layer)} from the start log's lines."""
    return {int(m[0]): (int(m[1]), int(m[2]))
            for m in re.findall(r"rank (\d+) of 2: layers (\d+)\.\.(\d+) of", stderr)}


def test_tiny_split_equals_one_process(tiny):
    one, _ = greedy(tiny, "--prefill", "4")
    assert len(one) > len(PROMPT)
    for extra in ([], ["--layer-split", "1,1"]):
        two, err = greedy(tiny, "--prefill", "4", *extra, ranks=2)
        assert ranges(err) == {0: (0, 0), 1: (1, 1)}, err
        assert two == one, f"split {extra}: {two!r} != {one!r}"


@need_smol
def test_smollm2_split_equals_one_process():
    one, _ = greedy(SMOL, "--prefill", "8")
    assert "fox" in one[len(PROMPT):] or len(one) > len(PROMPT) + 20, one
    two, err = greedy(SMOL, "--prefill", "8", ranks=2)
    r = ranges(err)
    assert r[0][0] == 0 and r[1][1] == 29 and r[0][1] + 1 == r[1][0], err  # contiguous, every layer once
    assert two == one
    two, err = greedy(SMOL, "--prefill", "8", "--layer-split", "5,25", ranks=2)
    assert ranges(err) == {0: (0, 4), 1: (5, 29)}, err
    assert two == one
    # pipelined windows (forward.h): 8-token chunks as 2-token windows, only the last one's rows sent back;
    # the one-process reference reads 2-token chunks (the same rows per product)
    one2, _ = greedy(SMOL, "--prefill", "2")
    two, err = greedy(SMOL, "--prefill", "8", "--pipeline-windows", "4", ranks=2)
    assert two == one2


@need_smol
def test_smollm2_split_with_drafts():
    """Speculative decoding: batched verification and rejected rows (truncation) across the ranks."""
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16"
    one, err1 = greedy(SMOL, "--draft", "ngram", prompt=prompt)
    two, err2 = greedy(SMOL, "--draft", "ngram", prompt=prompt, ranks=2)
    assert two == one
    drafts = [re.search(r"drafts accepted (\d+) of (\d+)", e).groups() for e in (err1, err2)]
    assert drafts[0] == drafts[1] and int(drafts[0][1]) > 0, drafts


@pytest.mark.parametrize("spec", ["1,2", "0,2"])
def test_bad_layer_split_is_refused(tiny, spec):
    cmd = mpi(2) + [BIN, "run", "-m", tiny, "-p", "hi", "-n", "2", "-t", "1", "--layer-split", spec]
    r = run(cmd, timeout=60)
    assert r.returncode != 0
    assert "--layer-split" in r.stderr, r.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """strata serve, in one process or under mpirun; its log on a thread."""

    def __init__(self, ranks, *args, env=None):
        self.port = free_port()
        cmd = [BIN, "serve", "-m", str(SMOL), "--port", str(self.port), "--ctx", "1024", "-t", "1", *args]
        self.proc = subprocess.Popen(mpi(ranks) + cmd if ranks > 1 else cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env or ENV, errors="replace",
                                     start_new_session=True)
        self.lines = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if any("listening on" in line for line in self.lines) and self.health() == 200:
                return
            assert self.proc.poll() is None, "strata serve ended at start:\n" + self.log()
            time.sleep(0.2)
        self.stop()
        raise AssertionError("strata serve did not start:\n" + self.log())

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def log(self):
        return "\n".join(self.lines)

    def health(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status
        except (urllib.error.URLError, OSError):
            return None

    def complete(self, prompt, max_tokens, timeout=120):
        """(status, parsed body) of a greedy /v1/completions."""
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def descendants(pid):
    """Every process below pid, from /proc."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def gone(pids, timeout=30):
    """Whether every pid has ended (or is a zombie) within timeout: not a descendant any more
    is not enough, an orphaned rank would be reparented and keep running."""
    deadline = time.time() + timeout
    while True:
        left = []
        for p in pids:
            try:
                state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                left.append(p)
        if not left or time.time() > deadline:
            return not left
        time.sleep(0.2)


def launched_rank(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(kv.split(b"=", 1)[1])
    return None


@need_smol
def test_serve_two_slots_batched_across_ranks():
    """Two requests at once on two slots: batched steps (engine_step) carry both sequences to rank 1."""
    job = Job(2, "--slots", "2")
    try:
        out = {}
        prompts = ["The capital of France is", "Once upon a time"]
        ts = [threading.Thread(target=lambda p=p: out.__setitem__(p, job.complete(p, 24))) for p in prompts]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        for p in prompts:
            st, body = out[p]
            assert st == 200, body
            assert body["usage"]["completion_tokens"] == 24, body
        assert "Paris" in out[prompts[0]][1]["choices"][0]["text"]
        deadline = time.time() + 10  # the speed lines are logged after the answers
        while time.time() < deadline and not (re.search(r"slot 0: prompt", job.log()) and
                                              re.search(r"slot 1: prompt", job.log())):
            time.sleep(0.1)
        assert re.search(r"slot 0: prompt", job.log()) and re.search(r"slot 1: prompt", job.log()), job.log()
    finally:
        job.stop()


@pytest.fixture(scope="module")
def want():
    """The one-process server's greedy answer to PROMPT, 16 tokens."""
    one = Job(1)
    try:
        st, body = one.complete(PROMPT, 16)
        assert st == 200, body
        return body
    finally:
        one.stop()


def kill_mid_request(job, pid):
    """SIGKILL pid while a 400-token request runs; that request's (status, body)."""
    result = {}
    t = threading.Thread(target=lambda: result.__setitem__("r", job.complete("Once upon a time", 400, 60)))
    t.start()
    time.sleep(1.5)  # the request is generating (400 tokens take far longer)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive(), "the request in flight hung after a rank died"
    return result["r"]


@need_smol
def test_serve_under_mpirun_and_a_killed_rank(want):
    job = Job(2)
    try:
        st, got = job.complete(PROMPT, 16)
        assert st == 200, got
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert re.search(r"rank 1 of 2: layers \d+\.\.29 of 30", job.log()), job.log()

        # the second rank: launched by mpirun with rank 1 (rank 0's `serve` is the front end,
        # and its engine process joined the job as rank 0 in its place)
        rank1 = [p for p in descendants(job.proc.pid) if launched_rank(p) == 1 and
                 "engine" not in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")]
        assert len(rank1) == 1, rank1
        everyone = descendants(job.proc.pid)
        st, body = kill_mid_request(job, rank1[0])
        assert st == 503, body
        assert "engine stopped unexpectedly" in body["error"]["message"], body
        # mpirun ends every rank, the front end among them: the job is gone, nothing waits
        job.proc.wait(30)
        assert gone(everyone), everyone
    finally:
        job.stop()


@need_smol
def test_serve_engine_killed_ends_the_job():
    """The engine process (the job's rank 0) killed mid-request: 503, then the server stops and
    exits non-zero, so mpirun ends rank 1 too (it cannot take a new rank 0); nothing spins on."""
    job = Job(2)
    try:
        with urllib.request.urlopen(job.url + "/health", timeout=5) as r:
            engine = json.loads(r.read())["engine_pid"]
        everyone = descendants(job.proc.pid)
        assert engine in everyone
        st, body = kill_mid_request(job, engine)
        assert st == 503, body
        assert "cannot restart" in body["error"]["message"], body
        assert job.proc.wait(30) != 0
        assert gone(everyone), everyone
        assert "exiting with code 3 so that mpirun ends" in job.log(), job.log()
    finally:
        job.stop()


@need_smol
def test_serve_ranks_restarts_the_job(want):
    """serve --ranks 2: the server launches the engine as an MPI job itself; rank 1 killed
    mid-request gives 503, and the next request starts a new job that answers as before."""
    env = dict(ENV, STRATA_MPIRUN=f"{MPIRUN} --oversubscribe")
    job = Job(1, "--ranks", "2", env=env)
    try:
        st, got = job.complete(PROMPT, 16)
        assert st == 200, got
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        rank1 = [p for p in descendants(job.proc.pid) if launched_rank(p) == 1]
        assert len(rank1) == 1, rank1
        st, body = kill_mid_request(job, rank1[0])
        assert st == 503, body
        assert "the next request restarts it" in body["error"]["message"], body
        st, again = job.complete(PROMPT, 16)
        assert st == 200, again
        assert again["choices"][0]["text"] == want["choices"][0]["text"]
        assert "restarted" in job.log(), job.log()
        new_rank1 = [p for p in descendants(job.proc.pid) if launched_rank(p) == 1]
        assert len(new_rank1) == 1 and new_rank1 != rank1, new_rank1
        everyone = descendants(job.proc.pid)
        job.proc.send_signal(signal.SIGTERM)  # the server alone: it ends its engine job itself
        assert job.proc.wait(30) == 0, job.log()
        assert gone(everyone), everyone
    finally:
        job.stop()
