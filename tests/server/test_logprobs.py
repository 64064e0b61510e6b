"""logprobs / top_logprobs (chat and completions) and JSON mode against the
real default model, with the openai SDK.

Logprobs are the model's log-softmax (before temperature), so at temperature
0 the chosen token is always the most likely one: each entry must equal its
own first alternative, the alternatives must be sorted and their
probabilities sum to at most 1, and the tokens must spell the answer exactly.
JSON mode: every answer that ends by itself parses as a JSON object; one cut
by max_tokens must at least start as an object (its prefix validity is the
constraint's job and is not re-checked here)."""
import json
import math


def check_entries(entries, n_top):
    for e in entries:
        assert e.logprob <= 1e-6 and len(e.top_logprobs) == n_top, e
        assert e.token == e.top_logprobs[0].token and abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6, e
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1 + 1e-4, lps
        assert bytes(e.bytes) == e.token.encode(), e


def test_chat_logprobs(oai):
    msgs = [{"role": "user", "content": "Name three fruits."}]
    r = oai.chat.completions.create(model="any", messages=msgs, max_tokens=12, temperature=0, logprobs=True,
                                    top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage)
    assert "".join(e.token for e in lp) == r.choices[0].message.content
    check_entries(lp, 3)
    toks, text = [], ""
    for c in oai.chat.completions.create(model="any", messages=msgs, max_tokens=12, temperature=0, logprobs=True,
                                         top_logprobs=1, stream=True):
        if c.choices:
            text += c.choices[0].delta.content or ""
            if c.choices[0].logprobs:
                toks += c.choices[0].logprobs.content
    assert "".join(e.token for e in toks) == text and len(toks) >= 1
    check_entries(toks, 1)
    text0 = r.choices[0].message.content
    r = oai.chat.completions.create(model="any", messages=msgs, max_tokens=3, temperature=0)
    assert r.choices[0].logprobs is None
    print(f"checked: chat logprobs of {len(lp)} tokens spell {text0!r}, top-1 = chosen "
          f"(greedy), sorted, sum <= 1; stream {len(toks)} tokens spell its text")


def test_chat_logprobs_with_tools(oai):
    # tools change how the answer is built (tool calls parsed out of it), not whether logprobs come back
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "Hi"}]
    r = oai.chat.completions.create(model="any", messages=msgs, tools=tools, max_tokens=4, temperature=0,
                                    logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.content) == r.usage.completion_tokens, r
    check_entries(lp.content, 2)
    n = 0
    for c in oai.chat.completions.create(model="any", messages=msgs, tools=tools, max_tokens=4, temperature=0,
                                         logprobs=True, top_logprobs=2, stream=True):
        if c.choices and c.choices[0].logprobs:
            n += len(c.choices[0].logprobs.content)
    assert n == len(lp.content), (n, len(lp.content))
    print(f"checked: chat with tools returns {len(lp.content)} logprob entries, streamed and not")


def test_completion_logprobs(oai):
    c = oai.completions.create(model="any", prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.tokens) == c.usage.completion_tokens
    off = 0
    for tok, l, top, o in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert o == off and len(top) == 2 and abs(top[tok] - l) < 1e-6 and l == max(top.values()), (tok, top)
        off += len(tok.encode())
    print(f"checked: legacy logprobs {lp.tokens} with offsets {lp.text_offset}")


def json_answers(oai, rf):
    """Four sampled answers under response_format rf: each starts a JSON object;
    each that ends by itself is one whole object, the rest were cut at
    max_tokens. Returns how many ended by themselves (at least one)."""
    done = 0
    for seed in range(4):
        r = oai.chat.completions.create(
            model="any", max_tokens=150, temperature=1, seed=seed, response_format=rf,
            messages=[{"role": "user", "content": 'Reply with a JSON object like {"color": "red"} naming a color.'}])
        t, fin = r.choices[0].message.content, r.choices[0].finish_reason
        assert t.lstrip().startswith("{"), t
        if fin == "stop":
            assert isinstance(json.loads(t), dict), t
            done += 1
        else:
            assert fin == "length" and r.usage.completion_tokens == 150
    assert done >= 1, "no JSON answer finished within 150 tokens in 4 tries"
    return done


def test_json_mode(oai):
    done = json_answers(oai, {"type": "json_object"})
    print(f"checked: json_object mode, {done} of 4 answers complete and valid, the rest cut by max_tokens")


def test_json_schema_mode(oai):
    # json_schema is enforced (test_grammar.py checks it against jsonschema): every answer that ends by
    # itself is an object with a string "color" and nothing else
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    rf = {"type": "json_schema", "json_schema": {"name": "color_answer", "schema": schema, "strict": True}}
    done = json_answers(oai, rf)
    a = oai.chat.completions.create(model="any", max_tokens=30, temperature=1, seed=7, response_format=rf,
                                    messages=[{"role": "user", "content": "Name a color as JSON."}])
    if a.choices[0].finish_reason == "stop":
        v = json.loads(a.choices[0].message.content)
        assert list(v) == ["color"] and isinstance(v["color"], str), v
    print(f"checked: json_schema mode, {done} of 4 answers complete JSON objects; seed 7 gives "
          f"{a.choices[0].message.content!r}")
