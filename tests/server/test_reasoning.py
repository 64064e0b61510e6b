"""Reasoning apart from the answer (issue 17, item 12): reasoning_format, <think> blocks (written by the model,
or opened by the template's generation prompt), the harmony format of gpt-oss, and n_probs in streams.

The default 135M model does not reason by itself, so the answers are made to: a `grammar` makes it write a
<think> block or harmony messages followed by free text (greedy), or a copy of the model whose template opens
the think block in the prompt makes all it writes reasoning. Every check is exact: the reasoning the server
returns must be the text between the markers and the content what follows them, compared with the raw answer
that reasoning_format none returns for the same greedy run, so reasoning leaking into the content (or content
into the reasoning) fails. Clients: the official openai and anthropic SDKs, and httpx for raw SSE."""
import json
import os
import subprocess
import sys

import pytest

from conftest import MODEL, Server, httpx

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "jinja", "templates")
HI = [{"role": "user", "content": "Hi"}]
THINK = "I should greet the user."
THINK_G = 'root ::= "<think>\\n' + THINK + '\\n</think>\\n\\n" [A-Za-z ,.!]{5,40}'
ANALYSIS = "The user greets. Reply briefly."
HARMONY_G = ('root ::= "<|channel|>analysis<|message|>' + ANALYSIS +
             '<|end|><|start|>assistant<|channel|>final<|message|>" [A-Za-z ,.!]{5,40}')
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}]


def model_with_template(tmp, name, template):
    """A copy of the default model with another chat template (the gguf package's own tool)."""
    src = os.path.join(tmp, name + ".jinja")
    with open(src, "w") as f:
        f.write(template)
    out = os.path.join(tmp, name + ".gguf")
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template-file", src, MODEL, out,
                    "--force"], check=True, capture_output=True)
    return out


def chat(server, **kw):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HI, "temperature": 0, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, path, body, headers=None):
    """The data objects of a raw SSE stream."""
    r = httpx.post(server.url + path, json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_think_split(server, oai):
    """A <think> block at the start of the answer: reasoning_content and content, exact, streamed the same."""
    raw = chat(server, grammar=THINK_G, max_tokens=60, reasoning_format="none")["choices"][0]["message"]
    assert "reasoning_content" not in raw and raw["content"].startswith("<think>\n" + THINK + "\n</think>\n\n"), raw
    tail = raw["content"][len("<think>\n" + THINK + "\n</think>\n\n"):]
    assert len(tail) >= 5, raw
    for fmt in ("auto", "deepseek", None):
        extra = {"grammar": THINK_G} | ({"reasoning_format": fmt} if fmt else {})
        r = oai.chat.completions.create(model="m", messages=HI, max_tokens=60, temperature=0, extra_body=extra)
        m = r.choices[0].message
        assert m.reasoning_content == THINK and m.content == tail, (fmt, m)
    # streamed: the deltas add up to the same two texts, the reasoning first
    reasoning, content, order = "", "", []
    for ch in oai.chat.completions.create(model="m", messages=HI, max_tokens=60, temperature=0, stream=True,
                                          extra_body={"grammar": THINK_G}):
        d = ch.choices[0].delta if ch.choices else None
        if d is not None and getattr(d, "reasoning_content", None):
            reasoning += d.reasoning_content
            order.append("r")
        if d is not None and d.content:
            content += d.content
            order.append("c")
    assert reasoning == THINK and content == tail, (reasoning, content)
    assert order == sorted(order, key=lambda k: k != "r") and len(order) >= 4, order
    print(f"checked: <think> split exactly (reasoning {len(THINK)} chars, content {tail!r}), streamed in "
          f"{len(order)} deltas")


def test_n_probs_stream(server):
    """n_probs in a stream: each chunk carries the entries of its tokens, which together are the whole answer."""
    body = {"messages": HI, "temperature": 0, "max_tokens": 60, "grammar": THINK_G, "n_probs": 3,
            "logprobs": True, "top_logprobs": 1, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(server, "/v1/chat/completions", body)
    entries = [e for c in chunks for e in c.get("completion_probabilities", [])]
    oai_entries = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                   for e in c["choices"][0]["logprobs"]["content"]]
    usage = chunks[-1]["usage"]
    assert len(entries) == usage["completion_tokens"] == len(oai_entries), (len(entries), usage)
    whole = chat(server, grammar=THINK_G, max_tokens=60, n_probs=3, reasoning_format="none")
    assert [e["id"] for e in entries] == [e["id"] for e in whole["completion_probabilities"]]
    assert "".join(e["token"] for e in entries) == whole["choices"][0]["message"]["content"]
    for e, o in zip(entries, oai_entries):
        top = e["top_logprobs"]  # the model's own distribution (the grammar forced some tokens below its first)
        assert len(top) == 3 and all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:])), e
        assert e["logprob"] <= top[0]["logprob"] + 1e-6, e
        assert len(o["top_logprobs"]) == 1 and o["token"] == e["token"] and o["logprob"] == e["logprob"], (o, e)
    carrying = sum(1 for c in chunks if c.get("completion_probabilities"))
    assert carrying >= 4, carrying  # spread over the stream, not all at the end
    # completions stream too
    chunks = sse(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                             "n_probs": 2, "stream": True})
    entries = [e for c in chunks for e in c.get("completion_probabilities", [])]
    assert len(entries) == 6 and "".join(e["token"] for e in entries) == "".join(
        c["choices"][0]["text"] for c in chunks if c["choices"]), entries
    print(f"checked: n_probs streamed, {usage['completion_tokens']} entries over {carrying} chunks, equal to the "
          "non-streamed ones")


@pytest.fixture(scope="module")
def open_think(tmp_path_factory):
    """The default model with a template that opens <think> in the generation prompt unless enable_thinking is
    false (as DeepSeek R1's and QwQ's do)."""
    with open(os.path.join(TEMPLATES, "smollm2.jinja")) as f:
        t = f.read().rstrip("\n")
    t = t.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is not defined "
                  "or enable_thinking %}{{ '<think>\n' }}{% endif %}{% endif %}")
    assert "<think>" in t
    # a context of 2048: the Anthropic budget test's 1024 tokens of thinking and the answer after them fit
    s = Server("--slots", "1", "--ctx", "2048", "-m",
               model_with_template(str(tmp_path_factory.mktemp("think")), "think", t))
    yield s
    assert s.stop() == 0


def test_think_opened_by_prompt(open_think):
    import anthropic
    import openai
    oai = openai.OpenAI(base_url=open_think.url + "/v1", api_key="x", max_retries=0, timeout=120)
    raw = chat(open_think, max_tokens=24, reasoning_format="none")["choices"][0]["message"]["content"]
    assert raw.strip(), raw
    m = oai.chat.completions.create(model="m", messages=HI, max_tokens=24, temperature=0).choices[0].message
    assert m.reasoning_content == raw.strip() and m.content == "", m  # never closed: all of it is reasoning
    # a constrained answer waits for the reasoning to end: the grammar holds only what follows </think>
    js = oai.chat.completions.create(model="m", messages=HI, max_tokens=24, temperature=0,
                                     response_format={"type": "json_object"}).choices[0].message
    assert js.reasoning_content == raw.strip() and js.content == "", js
    off = oai.chat.completions.create(model="m", messages=HI, max_tokens=24, temperature=0,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0]
    assert getattr(off.message, "reasoning_content", None) is None and off.message.content, off
    eff = oai.chat.completions.create(model="m", messages=HI, max_tokens=24, temperature=0, reasoning_effort="none")
    assert eff.choices[0].message.content == off.message.content, eff  # "none": enable_thinking false
    # a prefill (the last assistant message, continued) inside the open block: the rest is reasoning
    pre = HI + [{"role": "assistant", "content": "Let me think"}]
    cont = chat(open_think, messages=pre, max_tokens=16, reasoning_format="none")["choices"][0]["message"]["content"]
    m = oai.chat.completions.create(model="m", messages=pre, max_tokens=16, temperature=0).choices[0].message
    assert m.reasoning_content == cont.rstrip() and m.content == "", (cont, m)
    # Anthropic: the same reasoning as a thinking block, streamed as thinking_delta + signature_delta
    anth = anthropic.Anthropic(base_url=open_think.url, api_key="x", max_retries=0, timeout=120)
    msg = anth.messages.create(model="m", max_tokens=24, extra_body={"temperature": 0}, messages=HI)
    assert [b.type for b in msg.content] == ["thinking"], msg.content  # no text after it: no text block
    assert msg.content[0].thinking == raw.strip() and msg.content[0].signature == ""
    with anth.messages.stream(model="m", max_tokens=24, extra_body={"temperature": 0}, messages=HI) as st:
        events = [e.type for e in st]
        final = st.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in msg.content], final.content
    assert "thinking" in events and "signature" in events, events
    # thinking disabled reaches the template (enable_thinking false): no block, the answer is text
    msg = anth.messages.create(model="m", max_tokens=24, extra_body={"temperature": 0}, messages=HI,
                               thinking={"type": "disabled"})
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == off.message.content, msg.content
    msg = anth.messages.create(model="m", max_tokens=1100, extra_body={"temperature": 0}, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert msg.content[0].type == "thinking" and msg.content[0].thinking.startswith(raw.strip()[:10]), msg.content
    # an earlier answer's thinking block sent back is accepted
    again = anth.messages.create(model="m", max_tokens=4, extra_body={"temperature": 0}, messages=HI + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": ""},
                                          {"type": "text", "text": "Hello."}]}, {"role": "user", "content": "Bye"}])
    assert again.content[0].type == "thinking", again
    print(f"checked: a prompt-opened <think> block is all reasoning ({raw.strip()[:40]!r}...) in both APIs and "
          "streams; enable_thinking false and Anthropic thinking disabled give plain text")


def n_tokens(server, text):
    """How many tokens text is (the server's /tokenize, no BOS)."""
    r = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=60)
    assert r.status_code == 200, r.text
    return len(r.json()["tokens"])


def test_reasoning_budget(open_think):
    """llama-server's reasoning_budget_tokens: once the reasoning has spent that many tokens the engine writes
    </think> and the answer follows. The model, whose prompt opens the block, never closes it by itself, so every
    check fails without the budget: greedy, the reasoning with a budget of N is exactly the first N tokens the
    model writes without one, and the raw text goes on with </think> there."""
    import openai
    oai = openai.OpenAI(base_url=open_think.url + "/v1", api_key="x", max_retries=0, timeout=120)
    first = chat(open_think, max_tokens=16, reasoning_format="none")
    assert first["choices"][0]["finish_reason"] == "length" and first["usage"]["completion_tokens"] == 16, first
    head = first["choices"][0]["message"]["content"]  # the first 16 tokens, all reasoning
    free = oai.chat.completions.create(model="m", messages=HI, max_tokens=40, temperature=0).choices[0].message
    assert free.content == "" and free.reasoning_content.startswith(head.strip()) and \
        len(free.reasoning_content) > len(head.strip()), free  # no budget: 40 tokens of reasoning, never ended
    raw = chat(open_think, max_tokens=40, reasoning_format="none", reasoning_budget_tokens=16)
    assert raw["choices"][0]["message"]["content"].startswith(head + "</think>"), raw
    assert raw["usage"]["completion_tokens"] > 16 + n_tokens(open_think, "</think>") - 1, raw["usage"]
    m = oai.chat.completions.create(model="m", messages=HI, max_tokens=40, temperature=0,
                                    extra_body={"reasoning_budget_tokens": 16}).choices[0].message
    assert m.reasoning_content == head.strip() and n_tokens(open_think, m.reasoning_content) <= 16, m
    alias = oai.chat.completions.create(model="m", messages=HI, max_tokens=40, temperature=0,
                                        extra_body={"thinking_budget_tokens": 16}).choices[0].message
    assert (alias.reasoning_content, alias.content) == (m.reasoning_content, m.content), alias
    # streamed: the deltas add up to the same reasoning and content
    reasoning, content = "", ""
    for ch in oai.chat.completions.create(model="m", messages=HI, max_tokens=40, temperature=0, stream=True,
                                          extra_body={"reasoning_budget_tokens": 16}):
        d = ch.choices[0].delta if ch.choices else None
        reasoning += (getattr(d, "reasoning_content", None) or "") if d is not None else ""
        content += (d.content or "") if d is not None else ""
    assert (reasoning, content) == (m.reasoning_content, m.content), (reasoning, content)
    # 0: the block is ended at once, and the model answers after it
    zero = oai.chat.completions.create(model="m", messages=HI, max_tokens=40, temperature=0,
                                       extra_body={"reasoning_budget_tokens": 0}).choices[0].message
    assert getattr(zero, "reasoning_content", None) is None and zero.content.strip(), zero
    zraw = chat(open_think, max_tokens=40, reasoning_format="none", reasoning_budget_tokens=0)
    assert zraw["choices"][0]["message"]["content"].startswith("</think>"), zraw
    for bad in (-2, "16", 1.5):
        r = httpx.post(open_think.url + "/v1/chat/completions",
                       json={"messages": HI, "max_tokens": 4, "reasoning_budget_tokens": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_budget_tokens", (bad, r.text)
    # llama-server's --reasoning-budget: the default of requests that do not say (-1 says "the server's")
    s = Server("--slots", "1", "--reasoning-budget", "16", "-m", open_think.args[open_think.args.index("-m") + 1])
    try:
        for extra in ({}, {"reasoning_budget_tokens": -1}):
            d = chat(s, max_tokens=40, **extra)["choices"][0]["message"]
            assert (d["reasoning_content"], d["content"]) == (m.reasoning_content, m.content), (extra, d)
        own = chat(s, max_tokens=24, reasoning_budget_tokens=100)["choices"][0]["message"]  # the request's wins
        assert own["reasoning_content"] == free.reasoning_content[:len(own["reasoning_content"])] and \
            len(own["reasoning_content"]) > len(m.reasoning_content), own
        anth = __import__("anthropic").Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=120)
        msg = anth.messages.create(model="m", max_tokens=40, extra_body={"temperature": 0}, messages=HI)
        assert msg.content[0].type == "thinking" and msg.content[0].thinking == m.reasoning_content, msg.content
    finally:
        assert s.stop() == 0
    print(f"checked: reasoning_budget_tokens 16 ends the reasoning at {head.strip()!r} (the first 16 tokens without "
          f"a budget), then </think> and {m.content!r}; 0 answers {zero.content[:40]!r}; streams equal; "
          "--reasoning-budget 16 is the default of both APIs")



def test_reasoning_budget_message(open_think):
    """llama-server's reasoning_budget_message (and --reasoning-budget-message): the text the engine writes before
    </think> when the budget ends the block, inside the reasoning. Greedy, the raw text is the first 16 tokens,
    the message, then </think>."""
    import anthropic
    import openai
    oai = openai.OpenAI(base_url=open_think.url + "/v1", api_key="x", max_retries=0, timeout=120)
    msg = " Time is up, answer now."
    head = chat(open_think, max_tokens=16, reasoning_format="none")["choices"][0]["message"]["content"]
    raw = chat(open_think, max_tokens=60, reasoning_format="none", reasoning_budget_tokens=16,
               reasoning_budget_message=msg)
    assert raw["choices"][0]["message"]["content"].startswith(head + msg + "</think>"), raw
    assert raw["usage"]["completion_tokens"] >= 16 + n_tokens(open_think, msg) + n_tokens(open_think, "</think>")
    m = oai.chat.completions.create(model="m", messages=HI, max_tokens=60, temperature=0, extra_body={
        "reasoning_budget_tokens": 16, "reasoning_budget_message": msg}).choices[0].message
    assert m.reasoning_content == (head + msg).strip(), m
    plain = chat(open_think, max_tokens=60, reasoning_budget_tokens=16, reasoning_budget_message="")
    assert plain["choices"][0]["message"]["reasoning_content"] == head.strip(), plain  # "": none
    for bad, code in ((5, "invalid_type"), ("x" * 4097, "invalid_value")):
        r = httpx.post(open_think.url + "/v1/chat/completions", timeout=60, json={
            "messages": HI, "max_tokens": 4, "reasoning_budget_tokens": 4, "reasoning_budget_message": bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
        assert r.json()["error"]["param"] == "reasoning_budget_message", r.text
    # the server's default, for both APIs; a request's own ("" included) wins
    s = Server("--slots", "1", "--reasoning-budget", "16", "--reasoning-budget-message", msg,
               "-m", open_think.args[open_think.args.index("-m") + 1])
    try:
        d = chat(s, max_tokens=60)["choices"][0]["message"]
        assert d["reasoning_content"] == m.reasoning_content, d
        own = chat(s, max_tokens=60, reasoning_budget_message="")["choices"][0]["message"]
        assert own["reasoning_content"] == head.strip(), own
        anth = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=120)
        a = anth.messages.create(model="m", max_tokens=60, extra_body={"temperature": 0}, messages=HI)
        assert a.content[0].type == "thinking" and a.content[0].thinking == m.reasoning_content, a.content
    finally:
        assert s.stop() == 0
    print(f"checked: reasoning_budget_message {msg!r}: reasoning {m.reasoning_content!r}, then {m.content!r}; "
          "--reasoning-budget-message is the default of both APIs")


def test_budget_ends_a_started_end(open_think):
    """A budget that runs out while the model is writing a several-token end text ("</" then "think>") writes
    only the rest of it: the end once, no "</" left in the reasoning. The logit bias makes the model's one
    token of reasoning "</" (a budget of 1)."""
    ids = httpx.post(open_think.url + "/tokenize", json={"content": "</think>"}, timeout=60).json()["tokens"]
    first = httpx.post(open_think.url + "/detokenize", json={"tokens": ids[:1]}, timeout=60).json()["content"]
    assert len(ids) > 1 and "</think>".startswith(first) and first != "</think>", (ids, first)
    body = {"max_tokens": 12, "reasoning_budget_tokens": 1, "logit_bias": {str(ids[0]): 100}}
    raw = chat(open_think, reasoning_format="none", **body)["choices"][0]["message"]["content"]
    assert raw.startswith(first) and raw.startswith("</think>") and not raw.startswith(first + "</think>"), raw
    m = chat(open_think, **body)["choices"][0]["message"]
    assert not m.get("reasoning_content") and m["content"] == raw[len("</think>"):].strip(), (m, raw)
    print(f"checked: the budget ran out after {first!r}: the engine wrote the rest ({raw[:20]!r}...), "
          "the reasoning is empty")


def test_thinking_budget_anthropic(open_think):
    """Anthropic's thinking.budget_tokens through the official SDK: the thinking block stops at 1024 tokens and the
    generation goes on past it (without the budget the reasoning of this prompt runs to max_tokens)."""
    import anthropic
    anth = anthropic.Anthropic(base_url=open_think.url, api_key="x", max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "List every integer from 1 to 2000 separated by commas."}]
    msg = anth.messages.create(model="m", max_tokens=1060, extra_body={"temperature": 0}, messages=ask,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert msg.content[0].type == "thinking", msg.content
    spent = n_tokens(open_think, msg.content[0].thinking)
    end = n_tokens(open_think, "</think>")
    assert 900 < spent <= 1024, spent  # the budget, not the model or max_tokens, ended it
    assert msg.usage.output_tokens >= 1024 + end, msg.usage  # the engine wrote </think> and went on
    after = "".join(b.text for b in msg.content[1:] if b.type == "text")
    print(f"checked: thinking.budget_tokens 1024: a thinking block of {spent} tokens, then {after[:40]!r} "
          f"({msg.usage.output_tokens} output tokens, stop {msg.stop_reason})")


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    """The default model with gpt-oss's chat template (harmony)."""
    with open(os.path.join(TEMPLATES, "gpt_oss.jinja")) as f:
        t = f.read()
    s = Server("--slots", "1", "-m", model_with_template(str(tmp_path_factory.mktemp("harmony")), "harmony", t))
    yield s
    assert s.stop() == 0


def test_harmony(harmony):
    import anthropic
    import openai
    raw = chat(harmony, grammar=HARMONY_G, max_tokens=80, reasoning_format="none")["choices"][0]["message"]["content"]
    head = "<|channel|>analysis<|message|>" + ANALYSIS + "<|end|><|start|>assistant<|channel|>final<|message|>"
    assert raw.startswith(head), raw
    tail = raw[len(head):]
    oai = openai.OpenAI(base_url=harmony.url + "/v1", api_key="x", max_retries=0, timeout=120)
    m = oai.chat.completions.create(model="m", messages=HI, max_tokens=80, temperature=0,
                                    extra_body={"grammar": HARMONY_G}).choices[0].message
    assert m.reasoning_content == ANALYSIS and m.content == tail and "<|" not in m.content, m
    reasoning = content = ""
    for ch in oai.chat.completions.create(model="m", messages=HI, max_tokens=80, temperature=0, stream=True,
                                          extra_body={"grammar": HARMONY_G}):
        d = ch.choices[0].delta if ch.choices else None
        reasoning += (getattr(d, "reasoning_content", None) or "") if d else ""
        content += (d.content or "") if d else ""
    assert reasoning == ANALYSIS and content == tail, (reasoning, content)
    # forced calls open a commentary message to the function; the call comes back as tool_calls / tool_use
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=WEATHER, tool_choice=choice, max_tokens=60, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "get_weather", c
        args = json.loads(c.message.tool_calls[0].function.arguments)
        assert isinstance(args.get("city"), str), args
    deltas = [ch.choices[0].delta for ch in oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=WEATHER, tool_choice="required",
        max_tokens=60, temperature=0, stream=True) if ch.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and json.loads("".join(
        tc.function.arguments or "" for tc in calls)) == args, calls
    assert not "".join(d.content or "" for d in deltas).strip(), deltas  # no harmony markup leaks as text
    anth = anthropic.Anthropic(base_url=harmony.url, api_key="x", max_retries=0, timeout=120)
    msg = anth.messages.create(model="m", max_tokens=60, extra_body={"temperature": 0}, tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Weather in Paris?"}],
                               tools=[{"name": "get_weather", "description": "The weather of a city",
                                       "input_schema": WEATHER[0]["function"]["parameters"]}])
    assert msg.stop_reason == "tool_use" and msg.content[-1].name == "get_weather", msg
    # the call and its result in the history render through the template (assistant to=functions..., a
    # functions.get_weather message), with the earlier reasoning as gpt-oss's `thinking`
    call = c.message.tool_calls[0]
    r = chat(harmony, max_tokens=2, tools=WEATHER, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                                          "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    plain = chat(harmony, max_tokens=2, tools=WEATHER, messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 10, (r["usage"], plain["usage"])
    # reasoning_effort reaches gpt-oss's template ("Reasoning: medium" by default)
    base = chat(harmony, max_tokens=1)["usage"]["prompt_tokens"]
    long = chat(harmony, max_tokens=1, reasoning_effort="very " * 8 + "high")["usage"]["prompt_tokens"]
    assert long > base + 3, (base, long)
    print(f"checked: harmony analysis -> reasoning ({ANALYSIS!r}), final -> content ({tail!r}), streamed the same; "
          f"forced calls (OpenAI required / named, streamed; Anthropic any) -> get_weather {args}")


def test_harmony_budget(harmony):
    """The reasoning budget under harmony: the engine ends the analysis message and opens the final one. A
    grammar lets the analysis be any length (greedy, the model writes "user" there by itself); budget 0 ends it
    at once, and the final message follows."""
    g = ('root ::= "<|channel|>analysis<|message|>" [a-z ]* "<|end|><|start|>assistant<|channel|>final<|message|>" '
         '[A-Za-z ,.!]{5,40}')
    final = "<|end|><|start|>assistant<|channel|>final<|message|>"
    free = chat(harmony, grammar=g, max_tokens=60)["choices"][0]["message"]
    assert free["reasoning_content"], free
    raw = chat(harmony, grammar=g, max_tokens=60, reasoning_format="none",
               reasoning_budget_tokens=0)["choices"][0]["message"]["content"]
    assert raw.startswith("<|channel|>analysis<|message|>" + final) and len(raw) > len(final) + 35, raw
    cut = chat(harmony, grammar=g, max_tokens=60, reasoning_budget_tokens=0)["choices"][0]["message"]
    assert "reasoning_content" not in cut and cut["content"] == raw[len("<|channel|>analysis<|message|>" + final):], cut
    print(f"checked: harmony, budget 0: the analysis ({free['reasoning_content']!r} without a budget) ends at once, "
          f"the final message {cut['content']!r} follows")


def test_reasoning_format_refused(server):
    for bad, code in (("nope", "invalid_value"), (5, "invalid_type"), ("deepseek-legacy", "unsupported_parameter")):
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HI, "reasoning_format": bad},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (bad, r.text)
        assert r.json()["error"]["param"] == "reasoning_format", r.text
