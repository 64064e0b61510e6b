"""llama-server's sampling fields on a real `strata serve` (issue 17 item 12):
each changes the answer as its definition says. logit_bias (OpenAI's object
and llama-server's array, false to ban, a text's tokens) removes the greedy
token or forces another; typical_p 1 changes nothing; repeat_last_n widens
or switches off the repeat penalty's window; DRY penalizes a repeated
sequence; samplers names an order and unknown names are refused; n_probs
gives llama-server's completion_probabilities."""
from conftest import httpx

PROMPT = "The capital of France is"


def complete(server, **kw):
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 1, "logprobs": 1, **kw}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def first_token(server, **kw):
    r = complete(server, **kw)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def tok(server, text):
    r = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=10)
    return r.json()["tokens"]


def test_logit_bias(server):
    base = first_token(server)
    ids = tok(server, base)
    assert len(ids) == 1, (base, ids)
    t = ids[0]
    # the ban in each spelling: the greedy token is gone
    for bias in [{str(t): -100}, {str(t): False}, [[t, False]], [[base, -1e9]], {base: False}]:
        other = first_token(server, logit_bias=bias)
        assert other != base, (bias, other)
    # a big positive bias forces a token
    forced = tok(server, " banana")
    assert len(forced) == 1
    assert first_token(server, logit_bias={str(forced[0]): 100}) == " banana"
    assert first_token(server, logit_bias=[[forced[0], 100]]) == " banana"
    # and on the chat path
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Say a fruit"}], "temperature": 0, "max_tokens": 1,
        "logit_bias": {str(forced[0]): 100}}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == " banana", r.text
    # refused: a token outside the vocabulary, a bias that is not a number, a malformed pair
    for bad in [{"99999999": 1}, {str(t): "x"}, [[t]], [[t, True]], "x", {str(t): None}]:
        r = complete(server, logit_bias=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", (bad, r.text)
    print(f"checked: logit_bias bans {base!r} in 5 spellings, forces ' banana', refuses 6 bad ones")


def gen(server, n=40, **kw):
    body = {"prompt": "Repeat after me: one two three four, one two three four, one two three four,",
            "temperature": 0, "max_tokens": n, **kw}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_typical_p_and_order(server):
    plain = gen(server, temperature=1, seed=7)
    assert gen(server, temperature=1, seed=7, typical_p=1) == plain
    assert gen(server, temperature=1, seed=7, samplers=["penalties", "dry", "top_k", "typ_p", "temperature",
                                                         "top_p", "min_p", "xtc", "top_n_sigma"]) == plain
    assert gen(server, temperature=1, seed=7, samplers=["top-k", "temp", "nucleus", "minp"]) == plain
    assert gen(server, temperature=1, seed=7, samplers="edkytpm") == plain  # llama-server's letters
    low = {gen(server, temperature=1.5, seed=s, typical_p=0.05, n=8) for s in range(4)}
    high = {gen(server, temperature=1.5, seed=s, n=8) for s in range(4)}
    assert low != high, (low, high)
    r = complete(server, samplers=["top_k", "bogus", "temprature"])
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "'bogus'" in msg and "'temprature'" in msg and r.json()["error"]["param"] == "samplers", msg
    r = complete(server, samplers="kqt")
    assert r.status_code == 400 and "'q'" in r.json()["error"]["message"], r.text
    for bad in [{"typical_p": 2}, {"samplers": 5}, {"samplers": [1]}, {"samplers": ["infill"]}, {"samplers": "i"}]:
        r = complete(server, **bad)
        assert r.status_code == 400, (bad, r.text)
    print(f"checked: typical_p 1 and the default order spelled out change nothing; typical_p 0.05 gave "
          f"{len(low)} distinct answers of 4 ({len(high)} without); unknown sampler names refused by name")


def test_repeat_last_n(server):
    plain = gen(server)
    pen = gen(server, repeat_penalty=1.5, repeat_last_n=64)
    assert pen != plain, pen
    assert gen(server, repeat_penalty=1.5, repeat_last_n=0) == plain
    assert gen(server, repeat_penalty=1.5, repeat_last_n=-1) != plain
    assert complete(server, repeat_last_n=-2).status_code == 400
    print("checked: repeat_last_n 0 switches the penalty off, 64 and -1 change the answer")


def test_dry(server):
    plain = gen(server, n=60)
    assert plain.count("one two") >= 6, plain  # greedy loops on the pattern
    dry = gen(server, n=60, dry_multiplier=2.0, dry_sequence_breakers=[])
    assert dry.count("one two") <= 2, dry
    assert gen(server, n=60, dry_multiplier=0) == plain
    # a breaker on every token of the loop ends each repeat: nothing to penalize
    assert gen(server, n=60, dry_multiplier=2.0, dry_sequence_breakers=[" "]) == plain
    assert gen(server, n=4, dry_multiplier=1, dry_penalty_last_n=1 << 30)  # the window is bounded by the context
    assert complete(server, n_keep=-1).status_code == 200 and complete(server, n_keep=5).status_code == 200
    assert complete(server, n_keep=-2).status_code == 400
    for bad in [{"dry_base": 0.5}, {"dry_allowed_length": -1}, {"dry_sequence_breakers": "x"},
                {"dry_multiplier": 1, "dry_sequence_breakers": [""]}, {"dry_multiplier": -1}]:
        assert complete(server, **bad).status_code == 400, bad
    print(f"checked: DRY breaks the loop ({plain[:40]!r} -> {dry[:40]!r}); multiplier 0 and a breaker in every "
          "token change nothing")


def test_n_probs(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "temperature": 0, "max_tokens": 4,
                                                         "n_probs": 3}, timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    probs = d["completion_probabilities"]
    assert d["choices"][0]["logprobs"] is None, d  # not asked for: the API's own field stays null
    assert len(probs) == d["usage"]["completion_tokens"], probs
    assert "".join(p["token"] for p in probs) == d["choices"][0]["text"], probs
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}, p
        top = p["top_logprobs"]
        assert len(top) == 3 and top[0]["id"] == p["id"] and top[0]["logprob"] == p["logprob"], p  # greedy
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:])), top
        assert sum(2.718281828 ** t["logprob"] for t in top) <= 1.0001, top
    # beside the API's logprobs, each with its own count
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 3, "n_probs": 5,
        "logprobs": True, "top_logprobs": 1}, timeout=60)
    d = r.json()
    assert r.status_code == 200 and all(len(p["top_logprobs"]) == 5 for p in d["completion_probabilities"]), d
    assert all(len(c["top_logprobs"]) == 1 for c in d["choices"][0]["logprobs"]["content"]), d
    for bad in [{"n_probs": 21}, {"n_probs": -1}, {"n_probs": 21, "stream": True}]:
        assert complete(server, **bad).status_code == 400, bad
    print(f"checked: n_probs 3 gives completion_probabilities for {len(probs)} tokens, greedy first, with ids")
