"""Speculative decoding in the server (docs/speculative.md): with --draft
ngram every generating slot drafts tokens by prompt lookup, and the drafts
of all slots are verified in the one batched step the slots share. With f32
activations (STRATA_PRECISE=1, so that a batched product rounds as a
one-token one) the answers are the plain server's byte for byte, greedy and
seeded, alone or three at once; the slot's speed line and /metrics count
the drafts. The same on a hybrid (qwen35moe: the DeltaNet state is rolled
back to the accepted tokens), and on a hybrid with the MTP block drafting
(--draft mtp: every step's rows keep their hidden states for the block,
which reads them before each slot's draft). Random weights seldom repeat themselves, so
the requests carry a logit bias that lifts four tokens above the rest: the
text is then a sequence over those four, and drafts are both accepted and
rejected."""
import os
import re
import subprocess
import threading
import time

import pytest

from conftest import BIN, Server, httpx

PROMPT = "alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta"
PROMPTS = [PROMPT, "one two three one two three one two three one two", "red green blue red green blue red green"]
BIAS = {"40": 8, "41": 8, "42": 8, "43": 8}  # repetition (tests/engine/test_drafts.c does the same)


def servers(tmp_path_factory, arch):
    """A plain server and a drafting one on a tiny synth file; "qwen35moe-mtp": the file has the MTP block
    (synth --mtp) and the drafts come from it (--draft mtp; they add the request's logit bias too)."""
    path = tmp_path_factory.mktemp("drafts") / f"{arch}.gguf"
    mtp = arch.endswith("-mtp")
    args = ["--arch", arch.removesuffix("-mtp")] if arch != "qwen3moe" else []
    args += ["--mtp"] if mtp else []
    r = subprocess.run([BIN, "synth", *args, "--preset", "tiny", "-o", str(path), "--quiet"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    old = os.environ.get("STRATA_PRECISE")
    os.environ["STRATA_PRECISE"] = "1"
    try:
        plain = Server("-m", str(path), "-t", "2")
        drafted = Server("-m", str(path), "-t", "2", "--draft", "mtp" if mtp else "ngram", "--slots", "3")
    finally:
        if old is None:
            del os.environ["STRATA_PRECISE"]
        else:
            os.environ["STRATA_PRECISE"] = old
    return plain, drafted


@pytest.fixture(scope="module", params=["qwen3moe", "qwen35moe", "qwen35moe-mtp"])
def pair(request, tmp_path_factory):
    plain, drafted = servers(tmp_path_factory, request.param)
    yield request.param, plain, drafted
    assert plain.stop() == 0, plain.log()[-3000:]
    assert drafted.stop() == 0, drafted.log()[-3000:]


def complete(server, arch, prompt=PROMPT, **kw):
    body = {"prompt": prompt, "max_tokens": 48, "temperature": 0, "logit_bias": BIAS, **kw}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def drafts_line(server):
    """The last slot line's draft counts; the engine logs it just after the answer is sent, so it may lag."""
    for _ in range(200):
        lines = [ln for ln in server.lines if "drafts accepted" in ln]
        if lines:
            break
        time.sleep(0.05)
    m = re.search(r"drafts accepted (\d+) of (\d+)", lines[-1])
    return int(m.group(1)), int(m.group(2))


def draft_metrics(server, old=None):
    """(accepted, drafted) from /metrics; with old, once they differ from it (the counters move when a slot is
    released, just after its answer is sent)."""
    for _ in range(100):
        m = server.metrics()
        now = m["strata_draft_tokens_accepted_total"], m["strata_draft_tokens_total"]
        if old is None or now != old:
            return now
        time.sleep(0.05)
    return now


def test_drafted_answers_equal_plain(pair):
    arch, plain, drafted = pair
    a, b = complete(plain, arch, max_tokens=96), complete(drafted, arch, max_tokens=96)
    assert a == b, (a, b)
    acc, tot = drafts_line(drafted)
    assert 0 < acc <= tot, (acc, tot)
    assert drafts_line(plain) == (0, 0)
    # seeded sampling: each position draws as the plain decoder does
    a, b = complete(plain, arch, temperature=0.9, seed=11), complete(drafted, arch, temperature=0.9, seed=11)
    assert a == b, (a, b)
    print(f"checked: {arch}: greedy and seeded answers equal with drafts; {acc} of {tot} drafted tokens accepted")


@pytest.mark.parametrize("temp", [0, 0.9])
def test_concurrent_requests_draft_in_one_step(pair, temp):
    """Three requests at once: their drafts are rows of the shared batched
    steps; each answer is the plain server's, and /metrics counts the drafts."""
    arch, plain, drafted = pair
    want = [complete(plain, arch, p, temperature=temp, seed=5) for p in PROMPTS]
    acc0, tot0 = draft_metrics(drafted)
    out = [None] * len(PROMPTS)

    def go(i):
        out[i] = complete(drafted, arch, PROMPTS[i], temperature=temp, seed=5)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == want, (out, want)
    acc, tot = draft_metrics(drafted, (acc0, tot0))
    assert 0 < acc - acc0 <= tot - tot0, (acc0, tot0, acc, tot)
    assert draft_metrics(plain) == (0, 0)
    print(f"checked: {arch} temp {temp}: 3 concurrent requests give the plain answers; /metrics: "
          f"{acc - acc0:.0f} of {tot - tot0:.0f} drafted tokens accepted")
