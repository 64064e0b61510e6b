"""The server outlives the engine (DESIGN.md): `strata serve` runs the engine
in a child process (`strata engine --fd 3`). These tests kill that child
with signals while requests are in flight and while idle, and check:

- a stream already started ends with the API's SSE error event carrying
  exactly "the engine stopped unexpectedly (exit code N); the next request
  restarts it" (N = 128 + signal), seen through the official openai and
  anthropic SDKs;
- a non-streaming request running on the other slot, and one waiting in the
  queue, get HTTP 503 with that message in the API's error shape;
- the HTTP server itself stays up, the next request succeeds on a new engine
  process (the restart time is measured and printed), /health reports
  restarting then ok with the new pid;
- the engine process goes away when the server is killed (no orphan).

The engine's pid comes from /health and is checked against /proc (parent pid
and command line), so the test never signals a process that is not the child.
"""
import os
import re
import signal
import threading
import time

import pytest

from conftest import Server, httpx

MSG = "the engine stopped unexpectedly (exit code {}); the next request restarts it"
LONG = [{"role": "user", "content": "Write a very long story about a dragon who learns to sing."}]


def proc_stat(pid):
    """(state, ppid) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return None
    fields = s[s.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def engine_pid(server):
    h = httpx.get(server.url + "/health", timeout=10).json()
    pid = h["engine_pid"]
    st = proc_stat(pid)
    assert st is not None and st[1] == server.proc.pid, (pid, st, server.proc.pid)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert argv[1:4] == [b"engine", b"--fd", b"3"], argv
    return pid


def wait_gone(pid, timeout=10.0):
    """Wait until the server has reaped pid (no /proc entry, or another process's)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = proc_stat(pid)
        if st is None:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine process {pid} still exists after {timeout} s: {proc_stat(pid)}")


def wait_health(server, status, timeout=60.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = httpx.get(server.url + "/health", timeout=10)
        if r.json()["status"] == status:
            return r
        time.sleep(0.02)
    raise AssertionError(f"/health never said {status}: {r.status_code} {r.text}")


@pytest.fixture(scope="module")
def srv():
    s = Server("--slots", "2", "--queue", "4")
    yield s
    child = httpx.get(s.url + "/health", timeout=10).json()["engine_pid"]
    rc = s.stop()
    assert rc == 0, f"strata serve exited with {rc}\n{s.log()[-3000:]}"
    assert proc_stat(child) is None, f"engine process {child} outlived the server"
    print(f"checked: SIGTERM stops the server (exit 0) and its engine process {child}")


def restart_ms(server, after_line):
    """The 'ready in X ms ... restarted' log line written after line index after_line."""
    t0 = time.time()
    while time.time() - t0 < 10:
        for line in server.lines[after_line:]:
            m = re.search(r"engine: process \d+ ready in (\d+) ms .*restarted", line)
            if m:
                return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError("no restart line in the log:\n" + "\n".join(server.lines[after_line:]))


def kill_in_flight(server, api, sig):
    """Start a stream (SDK) on one slot, a non-streaming request on the other
    and one more in the queue, kill the engine with sig mid-stream, and check
    what each client got. Returns the seconds from the kill to the next answer."""
    import anthropic
    import openai
    want = MSG.format(128 + sig)
    pid = engine_pid(server)
    restarts0 = httpx.get(server.url + "/health").json()["engine_restarts"]
    started = threading.Event()
    got = {}

    def streamer():
        chunks = 0
        try:
            if api == "openai":
                c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
                for ch in c.chat.completions.create(model="m", messages=LONG, max_tokens=600, temperature=0.8,
                                                    stream=True, extra_body={"ignore_eos": True}):
                    if ch.choices and ch.choices[0].delta.content:
                        chunks += 1
                    if chunks >= 3:
                        started.set()
            else:
                c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
                with c.messages.stream(model="m", messages=LONG, max_tokens=600,
                                       extra_body={"temperature": 0.8}) as st:
                    for _ in st.text_stream:
                        chunks += 1
                        if chunks >= 3:
                            started.set()
            got["stream"] = ("finished", chunks)
        except Exception as e:  # the SDK's error for the SSE error event
            got["stream"] = (e, chunks)
        started.set()

    def poster(key):
        if api == "openai":
            url, body = "/v1/chat/completions", {"messages": LONG, "max_tokens": 600, "temperature": 0.8,
                                                 "ignore_eos": True}
        else:
            url, body = "/v1/messages", {"model": "m", "messages": LONG, "max_tokens": 600, "temperature": 0.8}
        got[key] = httpx.post(server.url + url, json=body, headers={"anthropic-version": "2023-06-01"}, timeout=60)

    ts = threading.Thread(target=streamer)
    ts.start()
    assert started.wait(60), "the stream never started"
    assert "stream" not in got, got
    tp = threading.Thread(target=poster, args=("running",))
    tp.start()
    server.wait_metric("strata_slots_busy", lambda v: v == 2, timeout=30)
    tq = threading.Thread(target=poster, args=("queued",))
    tq.start()
    server.wait_metric("strata_queue_depth", lambda v: v == 1, timeout=30)
    n0 = len(server.lines)
    os.kill(pid, sig)
    t_kill = time.time()
    for t in (ts, tp, tq):
        t.join(60)
        assert not t.is_alive()
    assert server.alive(), "the HTTP server died with its engine"

    err, chunks = got["stream"]
    assert not isinstance(err, str), f"the stream finished normally after {chunks} chunks"
    if api == "openai":
        assert isinstance(err, openai.APIError), repr(err)
        assert err.message == want, err.message
        assert err.body["message"] == want and err.body["type"] == "server_error", err.body
        assert err.body["code"] == "engine_stopped", err.body  # the same code as the 503 answers
    else:
        assert isinstance(err, anthropic.APIStatusError), repr(err)
        assert err.body == {"type": "error", "error": {"type": "overloaded_error", "message": want}}, err.body
    for key in ("running", "queued"):
        r = got[key]
        assert r.status_code == (503 if api == "openai" else 529), (key, r.status_code, r.text)
        e = r.json()
        if api == "openai":
            assert e == {"error": {"message": want, "type": "server_error", "param": None,
                                   "code": "engine_stopped"}}, e
        else:
            assert e == {"type": "error", "error": {"type": "overloaded_error", "message": want}}, e

    # the next request restarts the engine and succeeds
    t0 = time.time()
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0})
    t_next = time.time() - t0
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["engine_restarts"] == restarts0 + 1, h
    assert server.metrics()["strata_engine_restarts_total"] == restarts0 + 1  # /metrics counts it too
    new = engine_pid(server)
    assert new != pid
    wait_gone(pid)
    ms = restart_ms(server, n0)
    log = "\n".join(server.lines[n0:])
    assert f"engine: process {pid} was killed by signal {sig}" in log, log
    print(f"checked ({api}, signal {sig}): after {chunks} streamed chunks the stream got the SSE error "
          f"{want!r}; the running and the queued non-streaming requests got 503 (Anthropic: 529) in {api}'s shape; the server "
          f"stayed up; the next request succeeded in {t_next * 1e3:.0f} ms on engine {new} "
          f"(engine ready {ms} ms after spawn; {time.time() - t_kill:.2f} s since the kill)")


def test_sigkill_mid_stream_openai_twice(srv):
    kill_in_flight(srv, "openai", signal.SIGKILL)
    kill_in_flight(srv, "openai", signal.SIGKILL)


def test_sigkill_mid_stream_anthropic(srv):
    kill_in_flight(srv, "anthropic", signal.SIGKILL)


def test_other_signal_gives_its_exit_code(srv):
    # what a failed assertion in the engine looks like (abort): 134; SIGSEGV would
    # do as well in a plain build, but AddressSanitizer turns it into exit code 1
    kill_in_flight(srv, "openai", signal.SIGABRT)


def test_sigkill_mid_embeddings(srv):
    """Embeddings run in the engine process like generations: a kill while a long list is being embedded
    answers it 503 with the message, and the next embedding request succeeds on a new engine."""
    pid = engine_pid(srv)
    want = MSG.format(128 + signal.SIGKILL)
    got = {}
    body = {"input": ["Once upon a time " * 60 + str(i) for i in range(400)]}  # ~240 tokens each, seconds in all

    def poster():
        got["r"] = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=120)

    n0 = len(srv.lines)
    t = threading.Thread(target=poster)
    t.start()
    t0 = time.time()
    while not any("embedding of" in line for line in srv.lines[n0:]):  # the first inputs are done
        assert time.time() - t0 < 60, "no embedding was made"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive() and srv.alive()
    r = got["r"]
    assert r.status_code == 503 and r.json() == {"error": {"message": want, "type": "server_error", "param": None,
                                                           "code": "engine_stopped"}}, r.text
    done = sum("embedding of" in line for line in srv.lines[n0:])
    assert done < 400, done  # it was cut short, not answered after the fact
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["a", "b"]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text
    assert engine_pid(srv) != pid
    print(f"checked: SIGKILL after {done} of 400 embeddings -> 503 {want!r}; the next embeddings request 200")


def test_sigkill_idle_then_health_and_request(srv, ):
    import openai
    for _ in range(2):
        pid = engine_pid(srv)
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)  # the server has reaped it: the engine is down, nothing restarted it yet
        m = srv.metrics()
        assert m["strata_slots_busy"] == 0 and m["strata_queue_depth"] == 0, m
        t0 = time.time()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        r = c.completions.create(model="m", prompt="The capital of France is", max_tokens=4, temperature=0)
        dt = time.time() - t0
        assert r.usage.completion_tokens >= 1
        assert engine_pid(srv) != pid
        print(f"checked: engine {pid} SIGKILLed while idle; the next request restarted it and succeeded "
              f"in {dt * 1e3:.0f} ms")
    # a health probe also restarts a stopped engine: restarting (503) first, then ok (200)
    pid = engine_pid(srv)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    t0 = time.time()
    r = httpx.get(srv.url + "/health")
    assert r.status_code == 503 and r.json()["status"] == "restarting", r.text
    r = wait_health(srv, "ok")
    assert r.status_code == 200 and r.json()["engine_pid"] != pid
    print(f"checked: /health after an idle kill says restarting (503), then ok (200) after "
          f"{(time.time() - t0) * 1e3:.0f} ms with a new engine pid")


def test_engine_exits_when_server_is_killed():
    s = Server()
    child = engine_pid(s)
    s.proc.kill()
    s.proc.wait(10)
    t0 = time.time()
    while time.time() - t0 < 10:
        st = proc_stat(child)
        if st is None or st[0] == "Z":  # gone, or a zombie waiting for an init that does not reap
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"engine {child} still running after its server was SIGKILLed: {proc_stat(child)}")
    print(f"checked: SIGKILL of the server ends its engine process {child} (end of file on the socket) "
          f"within {(time.time() - t0) * 1e3:.0f} ms")


# ---- SIGTERM drains (issue 17, item 4) ----

def test_sigterm_drains_then_ends_streams_cleanly():
    # --shutdown-timeout 6: after SIGTERM new clients are refused at once, a short request in flight
    # finishes, and a long stream ends with the API's error event (the SDK raises it as an APIError,
    # not a connection error); the server exits 0. The short request is 4 tokens and the timeout 6 s:
    # 12 tokens beside the stream outlasted 3 s under ASan on a loaded 2-core CI machine
    import openai
    # ctx 8192 and 8000 tokens: at 1000 (the shared 1024 context) a fast CI machine finished the stream
    # inside the 6 s and the test saw no error event
    s = Server("--slots", "2", "--shutdown-timeout", "6", ctx=8192)
    oai = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    got = {}

    def short():
        got["short"] = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": LONG, "max_tokens": 4, "temperature": 0})

    try:
        # ignore_eos: the stream must still be running when the shutdown timeout ends it (a sampled end of text
        # within the timeout ended it cleanly once, on a quiet CI machine, and the test saw no error event)
        stream = oai.chat.completions.create(model="m", messages=LONG, max_tokens=8000, temperature=0.7, stream=True,
                                             extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)  # generating now
        t = threading.Thread(target=short)
        t.start()
        s.wait_metric("strata_slots_busy", lambda v: v == 2)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/v1/models", timeout=5)
        refused = time.time() - t0
        n = 0
        with pytest.raises(openai.APIError) as ei:
            for _ in it:
                n += 1
        ended = time.time() - t0
        assert "shutting down" in str(ei.value) and "--shutdown-timeout" in str(ei.value), ei.value
        assert not isinstance(ei.value, openai.APIConnectionError), ei.value
        assert 5.5 <= ended <= 10, ended
        t.join(30)
        assert got["short"].status_code == 200 and got["short"].json()["usage"]["completion_tokens"] == 4, \
            got["short"].text
        s.proc.wait(30)
    finally:
        rc = s.stop()
    assert rc == 0, s.log()[-2000:]
    print(f"checked: SIGTERM -> new connections refused ({refused:.1f} s), the short request in flight -> 200 with "
          f"4 tokens, the stream ran {n} more chunks and ended {ended:.1f} s after the signal with the SDK's "
          f"APIError {str(ei.value)[:90]!r}; exit code 0")


# ---- a stalled engine (issue 17, item 5) ----

def test_sigterm_cuts_a_non_streaming_answer_with_503():
    # a non-streaming answer still generating when --shutdown-timeout ends it: 503 shutting_down, never a
    # 200 whose text was cut (which a client could not tell from a max_tokens end); the server exits 0
    s = Server("--slots", "1", "--shutdown-timeout", "2")
    got = {}

    def long():
        got["r"] = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": LONG, "max_tokens": 900, "temperature": 0.7, "ignore_eos": True})

    try:
        t = threading.Thread(target=long)
        t.start()
        s.wait_metric("strata_slots_busy", lambda v: v == 1)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        t.join(30)
        ended = time.time() - t0
        r = got["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        assert 1.5 <= ended <= 6, ended
        s.proc.wait(30)
    finally:
        rc = s.stop()
    assert rc == 0, s.log()[-2000:]
    print(f"checked: SIGTERM with a non-streaming answer generating -> 503 shutting_down {ended:.1f} s after the "
          f"signal (--shutdown-timeout 2): {r.json()['error']['message'][:80]!r}; exit code 0")


def test_stopped_engine_is_killed_and_its_requests_get_503():
    # --engine-timeout 2: SIGSTOP the engine while it generates; /health stops saying ok within about a
    # second, the request gets 503 naming the stall once 2 s pass without a heartbeat, and the next
    # request runs on a new engine process
    s = Server("--slots", "1", "--engine-timeout", "2")
    try:
        pid = engine_pid(s)
        got = {}

        def waiter():
            got["r"] = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={
                "messages": LONG, "max_tokens": 500, "temperature": 0.7})

        t = threading.Thread(target=waiter)
        t.start()
        s.wait_metric("strata_slots_busy", lambda v: v == 1)
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        h = wait_health(s, "unresponsive", timeout=5)
        assert h.status_code == 503, h.text
        seen = time.time() - t0
        t.join(30)
        answered = time.time() - t0
        r = got["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped", r.text
        assert "stopped responding" in r.json()["error"]["message"] and "--engine-timeout" in r.text, r.text
        assert 1.5 <= answered <= 6, answered
        wait_gone(pid)
        r2 = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r2.status_code == 200, r2.text
        assert engine_pid(s) != pid
        assert "sent nothing for 2 s (--engine-timeout); killing it" in s.log()
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        rc = s.stop()
    assert rc == 0
    print(f"checked: SIGSTOP of the engine -> /health 503 'unresponsive' after {seen:.1f} s, the request -> 503 "
          f"{r.json()['error']['message']!r} after {answered:.1f} s; the next request -> 200 on a new engine")


# ---- the engine and the front end read the same model file (issue 17, items 2 and 9) ----

def test_replaced_model_file_is_refused(tmp_path):
    import shutil
    from conftest import MODEL
    model = tmp_path / "copy.gguf"
    shutil.copyfile(MODEL, model)
    s = Server("--slots", "1", "-m", str(model))
    try:
        ok = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert httpx.post(s.url + "/v1/chat/completions", json=ok, timeout=60).status_code == 200
        # other weights at the same path (a new file put in place, as a download or a copy does)
        other = tmp_path / "other.gguf"
        shutil.copyfile(MODEL, other)
        with open(other, "r+b") as f:
            f.seek(-4096, os.SEEK_END)
            f.write(os.urandom(4096))
        os.replace(other, model)
        pid = engine_pid(s)
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        r = httpx.post(s.url + "/v1/chat/completions", json=ok, timeout=60)
        assert r.status_code == 503, r.text
        msg = r.json()["error"]["message"]
        assert "copy.gguf is not the one this server started with (it was modified)" in msg, msg
        assert "restart strata serve" in msg and str(tmp_path) not in msg, msg
        # a zeroed header: named as a changed file, no guess about byte order, no absolute path
        with open(model, "r+b") as f:
            f.write(b"\0" * 64)
        r = httpx.post(s.url + "/v1/messages", json={"model": "m", **ok}, headers={"anthropic-version": "2023-06-01"},
                       timeout=60)
        assert r.status_code == 529, r.text
        msg2 = r.json()["error"]["message"]
        assert "(its header changed)" in msg2 and "big-endian" not in msg2 and str(tmp_path) not in msg2, msg2
    finally:
        rc = s.stop()
    assert rc == 0
    print(f"checked: the model file replaced, then an engine restart -> 503 {msg!r}; its header zeroed -> 529 "
          f"{msg2[:80]!r}...; no absolute path in either")
