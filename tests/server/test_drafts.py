"""Speculative decoding in the server (docs/speculative.md): with --draft
ngram a slot generating alone drafts tokens by prompt lookup and verifies
them in one batched pass. With f32 activations (STRATA_PRECISE=1, so that a
batched product rounds as a one-token one) the answers are the plain
server's byte for byte, greedy and seeded; the slot's speed line counts the
drafts; with two requests at once the step is the usual batched one."""
import os
import re
import subprocess
import threading

import pytest

from conftest import BIN, Server, httpx

PROMPT = "alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("drafts") / "moe.gguf"
    r = subprocess.run([BIN, "synth", "--preset", "tiny", "-o", str(path), "--quiet"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    old = os.environ.get("STRATA_PRECISE")
    os.environ["STRATA_PRECISE"] = "1"
    try:
        plain = Server("-m", str(path), "-t", "2")
        drafted = Server("-m", str(path), "-t", "2", "--draft", "ngram", "--slots", "2")
    finally:
        if old is None:
            del os.environ["STRATA_PRECISE"]
        else:
            os.environ["STRATA_PRECISE"] = old
    yield plain, drafted
    assert plain.stop() == 0, plain.log()[-3000:]
    assert drafted.stop() == 0, drafted.log()[-3000:]


def complete(server, **kw):
    body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, **kw}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def drafts_line(server):
    lines = [ln for ln in server.lines if "drafts accepted" in ln]
    m = re.search(r"drafts accepted (\d+) of (\d+)", lines[-1])
    return int(m.group(1)), int(m.group(2))


def test_drafted_answers_equal_plain(pair):
    plain, drafted = pair
    a, b = complete(plain), complete(drafted)
    assert a == b, (a, b)
    acc, tot = drafts_line(drafted)
    assert 0 < acc <= tot, (acc, tot)
    assert drafts_line(plain) == (0, 0)
    # seeded sampling: each position draws as the plain decoder does
    a, b = complete(plain, temperature=0.9, seed=11), complete(drafted, temperature=0.9, seed=11)
    assert a == b, (a, b)
    print(f"checked: greedy and seeded answers equal with drafts; {acc} of {tot} drafted tokens accepted")


def test_two_requests_still_batched(pair):
    _, drafted = pair
    want = complete(drafted)
    out = [None, None]

    def go(i):
        out[i] = complete(drafted)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == [want, want], out
    print("checked: two concurrent requests give the single request's answer")
