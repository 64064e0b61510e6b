"""A model that opens <think> itself reasons before its constrained answer (issue 17, item 10): with the
reasoning parsed, a grammar (response_format json_schema, `grammar`, Anthropic structured outputs, forced tool
calls) waits while the answer's leading think block runs and holds what follows </think>; the reasoning budget
still ends the block, and its forced </think> hands over to the grammar.

The default 135M model does not reason by itself, so it is shown how: a copy with a Qwen3-like template (it
writes an earlier answer's reasoning_content as <think>...</think> and knows the tags) and a conversation of two
earlier answers that reasoned first. Greedy, the model copies the pattern: it writes <think>, a sentence of
reasoning, </think> and a JSON object that lacks the schema's "legs". So each check fails in one way or another
without the change: the grammar from the first token leaves no reasoning (the reasoning_content checks), and an
answer left free after the block does not validate (the schema checks). Clients: the official openai and
anthropic SDKs."""
import json
import os
import re

import jsonschema
import pytest

from conftest import Server, httpx
from test_reasoning import TEMPLATES, WEATHER, model_with_template, n_tokens

SHOT = [{"role": "user", "content": "Give me a color as JSON."},
        {"role": "assistant", "reasoning_content": "The user wants a color. Red is a color.",
         "content": '{"color": "red"}'},
        {"role": "user", "content": "Give me a fruit as JSON."},
        {"role": "assistant", "reasoning_content": "The user wants a fruit. Apple is a fruit.",
         "content": '{"fruit": "apple"}'},
        {"role": "user", "content": "Give me an animal as JSON."}]
SCHEMA = {"type": "object", "properties": {"animal": {"type": "string", "maxLength": 20}, "legs": {"type": "integer"}},
          "required": ["animal", "legs"]}
RF = {"type": "json_schema", "json_schema": {"name": "animal", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def think_self(tmp_path_factory):
    """The default model with a template that writes an earlier answer's reasoning as a <think> block before its
    content (as Qwen3's does) and leaves the generation prompt open: the model opens the block itself."""
    with open(os.path.join(TEMPLATES, "smollm2.jinja")) as f:
        t = f.read().rstrip("\n")
    old = "' + message['content'] + '<|im_end|>'"
    assert old in t
    t = t.replace(old, "' + ('<think>\n' + message['reasoning_content'] + '\n</think>\n\n' if message["
                       "'reasoning_content'] is defined and message['reasoning_content'] else '') + message['content']"
                       " + '<|im_end|>'")
    s = Server("--slots", "1", "-m", model_with_template(str(tmp_path_factory.mktemp("self")), "self", t))
    yield s
    assert s.stop() == 0


def clients(server):
    import anthropic
    import openai
    return (openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120),
            anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120))


def ask(oai, **kw):
    kw.setdefault("temperature", 0)
    return oai.chat.completions.create(model="m", messages=kw.pop("messages", SHOT), max_tokens=80, **kw).choices[0]


def test_reasons_then_valid_json(think_self):
    oai, anth = clients(think_self)
    free = ask(oai).message  # no constraint: the block, then JSON that does not validate
    reasoning = free.reasoning_content
    assert reasoning and reasoning.startswith("The user wants"), free
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(free.content), SCHEMA)
    # json_schema: the same reasoning (it is free), then an answer the grammar held to the schema
    js = ask(oai, response_format=RF)
    assert js.message.reasoning_content == reasoning and js.finish_reason == "stop", js
    jsonschema.validate(json.loads(js.message.content), SCHEMA)
    # streamed: reasoning deltas first, then the constrained content; they add up to the same two texts
    order, r_text, c_text = [], "", ""
    for ch in oai.chat.completions.create(model="m", messages=SHOT, max_tokens=80, temperature=0, stream=True,
                                          response_format=RF):
        d = ch.choices[0].delta if ch.choices else None
        if d is not None and getattr(d, "reasoning_content", None):
            r_text += d.reasoning_content
            order.append("r")
        if d is not None and d.content:
            c_text += d.content
            order.append("c")
    assert (r_text, c_text) == (reasoning, js.message.content), (r_text, c_text)
    assert order == sorted(order, key=lambda k: k != "r") and order.count("c") >= 2, order
    # llama-server's `grammar` field: after the block, a sentence of the grammar
    g = 'root ::= "{\\"animal\\": \\"" [a-z]+ "\\", \\"legs\\": " [0-9] "}"'
    gm = ask(oai, extra_body={"grammar": g}).message
    assert gm.reasoning_content == reasoning and set(json.loads(gm.content)) == {"animal", "legs"}, gm
    # a grammar whose sentences start like <think> ("<"): both ways stay open until "think" leaves the grammar's;
    # the grammar after the block starts afresh
    tag = ask(oai, extra_body={"grammar": 'root ::= "<answer>" [a-z]+ "</answer>"'}).message
    assert tag.reasoning_content == reasoning and re.fullmatch("<answer>[a-z]+</answer>", tag.content), tag
    # top_p: every step masks the whole vocabulary, whose allowed set includes the way to <think> at first
    tp = ask(oai, response_format=RF, temperature=0.01, top_p=0.9, seed=1)
    assert tp.message.reasoning_content == reasoning, tp
    jsonschema.validate(json.loads(tp.message.content), SCHEMA)
    # Anthropic structured outputs: a thinking block, then the text held to the schema
    amsgs = [{"role": m["role"], "content": m["content"] if m["role"] == "user" else [
        {"type": "thinking", "thinking": m["reasoning_content"], "signature": ""},
        {"type": "text", "text": m["content"]}]} for m in SHOT]
    msg = anth.messages.create(model="m", max_tokens=80, messages=amsgs, extra_body={
        "temperature": 0, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == reasoning, msg
    jsonschema.validate(json.loads(msg.content[1].text), SCHEMA)
    # reasoning_format none: nothing is parsed, so nothing waits: the grammar holds the answer from its first token
    raw = ask(oai, response_format=RF, extra_body={"reasoning_format": "none"}).message
    assert raw.content.startswith("{") and "<think>" not in raw.content, raw
    jsonschema.validate(json.loads(raw.content), SCHEMA)
    # a model that does not open the block (no examples): the grammar holds the answer from its first token
    plain = ask(oai, messages=SHOT[-1:], response_format=RF).message
    assert getattr(plain, "reasoning_content", None) is None and plain.content.startswith("{"), plain
    jsonschema.validate(json.loads(plain.content), SCHEMA)
    print(f"checked: reasoning {reasoning!r} then {js.message.content!r} (free: {free.content!r}); streamed in "
          f"{len(order)} deltas; grammar {gm.content!r}; Anthropic {msg.content[1].text!r}; without reasoning "
          f"{plain.content!r}")


def test_budget_hands_over_to_grammar(think_self):
    """The reasoning budget ends the block the model opened, and the grammar holds what follows the forced
    </think>: the reasoning is the first N tokens of the free one."""
    oai, _ = clients(think_self)
    full = ask(oai, response_format=RF).message.reasoning_content
    cut = {}
    for budget in (5, 2):
        c = ask(oai, response_format=RF, extra_body={"reasoning_budget_tokens": budget})
        r = cut[budget] = c.message.reasoning_content
        assert r and full.startswith(r) and len(r) < len(full) and n_tokens(think_self, r) <= budget, (budget, c)
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    zero = ask(oai, response_format=RF, extra_body={"reasoning_budget_tokens": 0})
    assert getattr(zero.message, "reasoning_content", None) is None and zero.finish_reason == "stop", zero
    jsonschema.validate(json.loads(zero.message.content), SCHEMA)
    print(f"checked: budgets 5 and 2 end the reasoning at {cut[5]!r} and {cut[2]!r} (of {full!r}), then "
          f"{c.message.content!r}; budget 0: {zero.message.content!r}")


def test_reasons_then_forced_call(think_self, open_prompt_model):
    """Forced calls (OpenAI required / a named function, streamed; Anthropic any): the call's opening is no longer
    written into the prompt when the model may reason first; the grammar starts with it after the block."""
    oai, anth = clients(think_self)
    reasoning = ask(oai).message.reasoning_content
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        c = ask(oai, tools=WEATHER, tool_choice=choice)
        assert c.finish_reason == "tool_calls" and c.message.reasoning_content == reasoning, c
        assert c.message.tool_calls[0].function.name == "get_weather" and not c.message.content, c
        jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments),
                            WEATHER[0]["function"]["parameters"])
    order, r_text, args = [], "", ""
    for ch in oai.chat.completions.create(model="m", messages=SHOT, max_tokens=80, temperature=0, stream=True,
                                          tools=WEATHER, tool_choice="required"):
        d = ch.choices[0].delta if ch.choices else None
        if d is not None and getattr(d, "reasoning_content", None):
            r_text += d.reasoning_content
            order.append("r")
        for tc in (d.tool_calls or []) if d is not None else []:
            args += tc.function.arguments or ""
            order.append("t")
    assert r_text == reasoning and json.loads(args) == json.loads(c.message.tool_calls[0].function.arguments), args
    assert order == sorted(order, key=lambda k: k != "r") and "t" in order, order
    # the budget's forced </think>, then the call
    cut = ask(oai, tools=WEATHER, tool_choice="required", extra_body={"reasoning_budget_tokens": 3})
    assert cut.finish_reason == "tool_calls" and reasoning.startswith(cut.message.reasoning_content), cut
    assert len(cut.message.reasoning_content) < len(reasoning), cut
    amsgs = [{"role": m["role"], "content": m["content"] if m["role"] == "user" else [
        {"type": "thinking", "thinking": m["reasoning_content"], "signature": ""},
        {"type": "text", "text": m["content"]}]} for m in SHOT]
    atool = [{"name": "get_weather", "description": "The weather of a city",
              "input_schema": WEATHER[0]["function"]["parameters"]}]
    msg = anth.messages.create(model="m", max_tokens=80, messages=amsgs, tools=atool, tool_choice={"type": "any"},
                               extra_body={"temperature": 0})
    assert [b.type for b in msg.content] == ["thinking", "tool_use"] and msg.stop_reason == "tool_use", msg
    assert msg.content[0].thinking == reasoning and msg.content[1].name == "get_weather", msg
    count = anth.messages.count_tokens(model="m", messages=amsgs, tools=atool, tool_choice={"type": "any"})
    read = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert count.input_tokens == read, (count, msg.usage)  # the same prompt, no opening in it
    # a prompt that opens the block: the reasoning first (ended here by the budget), then the call
    po, _ = clients(open_prompt_model)
    c2 = po.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    max_tokens=60, temperature=0, tools=WEATHER, tool_choice="required",
                                    extra_body={"reasoning_budget_tokens": 8}).choices[0]
    assert c2.finish_reason == "tool_calls" and c2.message.reasoning_content, c2
    assert "<tool_call>" not in c2.message.reasoning_content, c2
    jsonschema.validate(json.loads(c2.message.tool_calls[0].function.arguments), WEATHER[0]["function"]["parameters"])
    print(f"checked: reasoning {reasoning!r}, then get_weather {c.message.tool_calls[0].function.arguments} "
          f"(required, named, streamed, budget 3, Anthropic any); prompt-opened block "
          f"{c2.message.reasoning_content!r}, then {c2.message.tool_calls[0].function.arguments}")


@pytest.fixture(scope="module")
def open_prompt_model(tmp_path_factory):
    """The default model with a template that opens <think> in the generation prompt (DeepSeek R1's way)."""
    with open(os.path.join(TEMPLATES, "smollm2.jinja")) as f:
        t = f.read().rstrip("\n")
    old = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    assert old in t
    t = t.replace(old, "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}")
    s = Server("--slots", "1", "-m", model_with_template(str(tmp_path_factory.mktemp("open")), "open", t))
    yield s
    assert s.stop() == 0

