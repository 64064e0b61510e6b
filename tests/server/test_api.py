"""The server driven by the official openai and anthropic SDKs: chat and
completions, streaming and not, usage counts, count_tokens, stop sequences,
seeds, prefix reuse across turns (and routing to the slot that holds it),
cancellation when a client hangs up, and the speed line in the log."""
import re
import time


from conftest import CTX, httpx

USER = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_and_health(server, oai):
    ids = [m.id for m in oai.models.list().data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"], ids
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 2, h
    print("checked: /v1/models lists", ids, "; /health", h)


def test_chat_nonstream_and_stream_agree(server, oai, anth):
    r = oai.chat.completions.create(model="any", messages=USER, max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    assert isinstance(text, str) and text, r
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert 1 <= u.completion_tokens <= 8 and u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if r.choices[0].finish_reason == "length":
        assert u.completion_tokens == 8
    # the prompt the engine read is what count_tokens counts for the same messages
    n = anth.messages.count_tokens(model="any", messages=USER).input_tokens
    assert u.prompt_tokens == n, (u.prompt_tokens, n)

    chunks = list(oai.chat.completions.create(model="any", messages=USER, max_tokens=8, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert streamed == text, (streamed, text)
    assert finishes == [r.choices[0].finish_reason], finishes
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    # without include_usage no chunk carries usage
    plain = list(oai.chat.completions.create(model="any", messages=USER, max_tokens=3, temperature=0, stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason is not None
    print(f"checked: chat {text!r} ({u.prompt_tokens} prompt = count_tokens, {u.completion_tokens} generated), "
          f"stream of {len(chunks)} chunks equal, usage chunk last")


def test_completions(server, oai):
    r = oai.completions.create(model="any", prompt="The capital of France is", max_tokens=6, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens <= 6 and r.object == "text_completion"
    toks = httpx.post(server.url + "/tokenize", json={"content": "The capital of France is", "add_special": True})
    assert r.usage.prompt_tokens == len(toks.json()["tokens"])
    s = "".join(c.choices[0].text for c in oai.completions.create(
        model="any", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True))
    assert s == text, (s, text)
    # token ids as the prompt give the same continuation
    ids = toks.json()["tokens"]
    r2 = oai.completions.create(model="any", prompt=ids, max_tokens=6, temperature=0)
    assert r2.choices[0].text == text
    r3 = oai.completions.create(model="any", prompt=[ids], max_tokens=6, temperature=0)  # one prompt in a list
    assert r3.choices[0].text == text
    d = httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["content"]
    assert d.endswith("The capital of France is"), d
    print(f"checked: completion {text!r}, streamed equal, token-id prompt and [[ids]] equal, /tokenize count "
          f"{len(ids)} = usage, /detokenize round trip")


def test_anthropic_messages(server, anth):
    kw = dict(model="any", system="You answer in one short sentence.", messages=USER)
    n = anth.messages.count_tokens(**kw).input_tokens
    m = anth.messages.create(max_tokens=8, extra_body={"temperature": 0}, **kw)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    text = m.content[0].text
    assert text and m.stop_reason in ("end_turn", "max_tokens")
    # Anthropic's accounting: tokens read + tokens reused from the cache = the whole prompt
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n, (m.usage, n)
    assert 1 <= m.usage.output_tokens <= 8
    with anth.messages.stream(max_tokens=8, extra_body={"temperature": 0}, **kw) as st:
        streamed = "".join(st.text_stream)
        final = st.get_final_message()
    assert streamed == text and final.content[0].text == text, (streamed, text)
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == n
    # system as blocks and content as blocks render the same prompt
    n2 = anth.messages.count_tokens(model="any", system=[{"type": "text", "text": kw["system"]}],
                                    messages=[{"role": "user", "content": [{"type": "text",
                                                                            "text": USER[0]["content"]}]}]).input_tokens
    assert n2 == n
    print(f"checked: messages {text!r}, count_tokens {n} = input + cache_read, stream equal, blocks = strings")


def test_prefill_and_developer_role(server, oai, anth):
    # an Anthropic last assistant message is continued, not closed
    msgs = USER + [{"role": "assistant", "content": "The capital of France is"}]
    m = anth.messages.create(model="any", max_tokens=4, extra_body={"temperature": 0}, messages=msgs)
    n = anth.messages.count_tokens(model="any", messages=msgs).input_tokens
    closed = anth.messages.count_tokens(model="any", messages=USER).input_tokens
    toks = httpx.post(server.url + "/tokenize", json={"content": "The capital of France is"}).json()["tokens"]
    assert n == closed + len(toks), (n, closed, len(toks))  # the assistant turn is opened, the text follows
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n
    assert "Paris" in m.content[0].text, m.content[0].text
    # OpenAI's developer role is the system role
    a = oai.chat.completions.create(model="any", max_tokens=2, temperature=0,
                                    messages=[{"role": "developer", "content": "Be brief."}] + USER)
    b = oai.chat.completions.create(model="any", max_tokens=2, temperature=0,
                                    messages=[{"role": "system", "content": "Be brief."}] + USER)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.choices[0].message.content == b.choices[0].message.content
    print(f"checked: prefill continues {m.content[0].text!r} ({n} = {closed} + {len(toks)} tokens); developer = system")


def test_stop_sequences(server, oai, anth):
    msgs = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]
    full = oai.chat.completions.create(model="any", messages=msgs, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    assert len(text) >= 8, text
    # the stop string is taken from the answer itself (what a 135M model
    # writes is not ours to fix): the first 3-character piece from a third of
    # the way in that does not occur earlier
    i = len(text) // 3
    while i < len(text) - 3 and text.index(text[i:i + 3]) < i:
        i += 1
    stop = text[i:i + 3]
    assert len(stop) == 3 and text.index(stop) == i, text
    cut = text[:i]
    r = oai.chat.completions.create(model="any", messages=msgs, max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop", (r, cut)
    r = oai.chat.completions.create(model="any", messages=msgs, max_tokens=24, temperature=0, stop=stop)
    assert r.choices[0].message.content == cut
    s = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model="any", messages=msgs, max_tokens=24, temperature=0, stop=[stop], stream=True) if c.choices)
    assert s == cut
    m = anth.messages.create(model="any", max_tokens=24, extra_body={"temperature": 0}, messages=msgs,
                            stop_sequences=[stop])
    assert m.content[0].text == cut and m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
    print(f"checked: stop {stop!r} cuts {text!r} to {cut!r} (OpenAI list/string/stream, Anthropic stop_sequence)")


def test_seed_reproducible(server, oai):
    msgs = [{"role": "user", "content": "Write a short poem about the sea."}]
    kw = dict(model="any", messages=msgs, max_tokens=16, temperature=1.0)
    a = oai.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = oai.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b, (a, b)
    others = {oai.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds all gave the same text"
    print(f"checked: seed 1234 twice -> {a!r} both times; seeds 1,2,3 give {len(others | {a})} distinct texts")


def test_prefix_reuse_second_turn(server, oai):
    x1 = [{"role": "system", "content": "You are a helpful assistant who likes geography."},
          {"role": "user", "content": "Name a large river in Europe."}]
    r1 = oai.chat.completions.create(model="any", messages=x1, max_tokens=10, temperature=0)
    # another conversation in between: with two slots it must not evict x's history
    oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "Tell me about cats."}],
                                max_tokens=10, temperature=0)
    before = server.metrics()["strata_prompt_tokens_reused_total"]
    x2 = x1 + [{"role": "assistant", "content": r1.choices[0].message.content},
               {"role": "user", "content": "How long is it?"}]
    r2 = oai.chat.completions.create(model="any", messages=x2, max_tokens=6, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    after = server.metrics()["strata_prompt_tokens_reused_total"]
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)
    assert cached < r2.usage.prompt_tokens
    assert after - before == cached, (before, after, cached)
    print(f"checked: turn 2 reused {cached} of {r2.usage.prompt_tokens} prompt tokens (turn 1 prompt "
          f"{r1.usage.prompt_tokens}); /metrics reused counter rose by the same")


def test_disconnect_stops_generation(server):
    m0 = server.metrics()
    body = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "max_tokens": CTX, "temperature": 0.7, "stream": True}
    got = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
            if got >= 4:
                break
    # the response is closed: the slot must be free again within a moment
    server.wait_metric("strata_slots_busy", lambda v: v == 0, timeout=10)
    m1 = server.metrics()
    cancelled = m1['strata_generations_total{outcome="cancelled"}'] - m0['strata_generations_total{outcome="cancelled"}']
    gen = m1["strata_generated_tokens_total"] - m0["strata_generated_tokens_total"]
    assert cancelled == 1, cancelled
    assert gen < 200, gen
    assert "finish cancelled" in server.log()
    print(f"checked: closing the stream after {got} chunks cancelled the generation after {gen:.0f} tokens, slot freed")


def test_disconnect_nonstreaming_stops_generation(server):
    m0 = server.metrics()
    body = {"messages": [{"role": "user", "content": "Write a very long story about a castle."}],
            "max_tokens": CTX, "temperature": 0.7, "ignore_eos": True}
    try:  # give up after 1 s: the client closes the connection
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
        raise AssertionError("the request finished within 1 s; it should still be generating")
    except httpx.TimeoutException:
        pass
    server.wait_metric("strata_slots_busy", lambda v: v == 0, timeout=10)
    m1 = server.metrics()
    cancelled = m1['strata_generations_total{outcome="cancelled"}'] - m0['strata_generations_total{outcome="cancelled"}']
    gen = m1["strata_generated_tokens_total"] - m0["strata_generated_tokens_total"]
    assert cancelled == 1 and gen < 300, (cancelled, gen)
    print(f"checked: a non-streaming client that hung up after 1 s stopped its generation after {gen:.0f} tokens")


def test_speed_line_logged(server, oai):
    since = len(server.lines)
    oai.chat.completions.create(model="any", messages=USER, max_tokens=2, temperature=0)
    # this request's own line (the log reaches server.lines through a reader thread: wait for it)
    pat = (r"slot \d: prompt \d+ tokens = \d+ reused \+ \d+ read in [\d.]+ ms \([\d.]+ tok/s\), 2 generated in "
           r"[\d.]+ ms \([\d.]+ tok/s\), drafts accepted \d+ of \d+, finish length")
    t_end = time.time() + 5
    while not (lines := [l for l in server.lines[since:] if re.search(pat, l)]) and time.time() < t_end:
        time.sleep(0.02)
    assert lines, server.log()[-2000:]
    print("checked: speed line per request, e.g.", lines[-1])


def test_metrics_carry_gpu_lines(server):
    """/metrics holds the GPU block of /metrics/gpu (count, and per GPU memory,
    load, temperature, power where NVML has them): same names, same count."""
    m, g = server.metrics(), server.metrics("/metrics/gpu")
    gpu_keys = [k for k in g if k.startswith("strata_gpu_")]
    assert "strata_gpu_count" in gpu_keys
    missing = [k for k in gpu_keys if k not in m]
    assert not missing, missing
    assert m["strata_gpu_count"] == g["strata_gpu_count"]
    print(f"checked: /metrics carries the {len(gpu_keys)} GPU lines of /metrics/gpu "
          f"(strata_gpu_count {m['strata_gpu_count']:.0f} here)")
