"""Tools with the official SDKs against the real default model (SmolLM2-135M,
whose chat template knows nothing of tools, so the server describes them in
the system message and asks for the <tool_call> format).

What the 135M model can do: with tool_choice forcing a function the server
writes the call's opening and the model usually completes the arguments, but
not reliably as valid JSON (the parser is unit-tested on recorded outputs in
test_tools_parse.c). So the model-dependent checks here accept either a
parsed call or plain content, and check the response SHAPE strictly; the
history round trip (assistant tool calls + tool results) is checked exactly
through the token counts."""
import json
import os

from conftest import httpx

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]
ATOOLS = [{"name": "get_weather", "description": "Get the weather for a city",
           "input_schema": TOOLS[0]["function"]["parameters"]}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_oai_message(r):
    ch = r.choices[0]
    if ch.finish_reason == "tool_calls":
        assert ch.message.tool_calls, r
        for c in ch.message.tool_calls:
            assert c.type == "function" and c.function.name == "get_weather" and c.id.startswith("call_")
            assert isinstance(json.loads(c.function.arguments), dict)
        return "tool call " + ch.message.tool_calls[0].function.arguments
    assert ch.message.tool_calls is None and isinstance(ch.message.content, str), r
    return "text " + repr(ch.message.content[:40])


def test_openai_forced_tool_call(oai):
    seen = []
    for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
        r = oai.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                        max_tokens=40)
        seen.append(check_oai_message(r))
        # streaming: the call arrives as tool_calls deltas (index, id and name first, then argument
        # fragments), finish_reason tool_calls
        calls, content, finish = {}, "", None
        for c in oai.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=choice,
                                             temperature=0, max_tokens=40, stream=True):
            d = c.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                if tc.id:
                    calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments or ""}
                else:
                    calls[tc.index]["arguments"] += tc.function.arguments
            finish = c.choices[0].finish_reason or finish
        assert (finish == "tool_calls") == bool(calls), (finish, calls, content)
        for tc in calls.values():
            assert tc["name"] == "get_weather" and isinstance(json.loads(tc["arguments"]), dict)
        seen.append(f"stream {finish} {len(calls)} call(s)")
    print("checked: forced tool calls, openai SDK:", seen)


def test_anthropic_forced_tool_use(anth):
    m = anth.messages.create(model="any", max_tokens=40, messages=ASK, tools=ATOOLS,
                             tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert (m.stop_reason == "tool_use") == bool(uses), m
    for u in uses:
        assert u.name == "get_weather" and isinstance(u.input, dict) and u.id.startswith("toolu_")
    with anth.messages.stream(model="any", max_tokens=40, messages=ASK, tools=ATOOLS,
                              tool_choice={"type": "tool", "name": "get_weather"},
                              extra_body={"temperature": 0}) as s:
        fm = s.get_final_message()
    assert (fm.stop_reason == "tool_use") == any(b.type == "tool_use" for b in fm.content), fm
    print(f"checked: anthropic forced tool_use: {m.stop_reason} {m.content}; stream {fm.stop_reason}")


def test_history_round_trip(server, oai, anth):
    """Assistant tool calls and tool results in the history reach the prompt,
    in each API's shape, identically: the Anthropic request (tool_use /
    tool_result) is converted to the OpenAI one (tool_calls / role tool)."""
    oai_hist = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    anth_hist = ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18 C, sunny"}]}]
    r = oai.chat.completions.create(model="any", messages=oai_hist, tools=TOOLS, temperature=0, max_tokens=1)
    n_anth = anth.messages.count_tokens(model="any", messages=anth_hist, tools=ATOOLS).input_tokens
    assert r.usage.prompt_tokens == n_anth, (r.usage.prompt_tokens, n_anth)
    # the call and the result are in the prompt as the <tool_call>/<tool_response> text the model was asked for
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    resp = "<tool_response>\n18 C, sunny\n</tool_response>"
    without = anth.messages.count_tokens(model="any", tools=ATOOLS, messages=ASK + [
        {"role": "assistant", "content": "X"}, {"role": "user", "content": "Y"}]).input_tokens
    tok = lambda t: len(httpx.post(server.url + "/tokenize", json={"content": t}).json()["tokens"])
    assert n_anth - without == tok(call) - tok("X") + tok(resp) - tok("Y"), (n_anth, without)
    # and tools change the prompt (the system message describes them)
    plain = anth.messages.count_tokens(model="any", messages=ASK).input_tokens
    with_tools = anth.messages.count_tokens(model="any", messages=ASK, tools=ATOOLS).input_tokens
    assert with_tools > plain + 30, (plain, with_tools)
    print(f"checked: history with tool call + result = {n_anth} tokens in both APIs; tools add {with_tools - plain}")


def test_tool_choice_none_ignores_tools(oai):
    a = oai.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    b = oai.chat.completions.create(model="any", messages=ASK, max_tokens=1)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.choices[0].message.tool_calls is None
    print(f"checked: tool_choice none renders no tools ({a.usage.prompt_tokens} tokens)")


def test_markup_families(tmp_path):
    """Copies of the model whose template (patched in place, same length)
    carries the Qwen3.5 `<function=` / `<parameter=` or the GLM `<arg_key>`
    call markup: the server takes that family, a forced call opens in the
    family's markup and its grammar holds the rest, so each answer is a
    parsed call, or, cut by max_tokens (a free-text value the 135M model
    does not close), the opening and what followed. The parser and the
    grammars are unit-tested in test_tools_parse.c."""
    from conftest import MODEL, Server
    data = open(MODEL, "rb").read()
    old = b"You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert data.count(old) == 1
    families = {"xml": (b"tools: <function=NAME><parameter=KEY>V</parameter></function>",
                        "<tool_call>\n<function=get_weather>\n"),
                "glm": (b"tools: <tool_call>NAME<arg_key>KEY</arg_key><arg_value>V</arg_value>",
                        "<tool_call>get_weather\n")}
    seen = []
    for fam, (mark, opening) in families.items():
        assert len(mark) <= len(old)
        model = tmp_path / f"{fam}.gguf"
        model.write_bytes(data.replace(old, mark + b" " * (len(old) - len(mark))))
        s = Server("--slots", "1", "-m", str(model))
        try:
            forced = {"type": "function", "function": {"name": "get_weather"}}
            body = {"messages": ASK, "tools": TOOLS, "tool_choice": forced, "temperature": 0, "max_tokens": 48}
            r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            msg, finish = r.json()["choices"][0]["message"], r.json()["choices"][0]["finish_reason"]
            if msg.get("tool_calls"):
                assert finish == "tool_calls" and msg["tool_calls"][0]["function"]["name"] == "get_weather", msg
                json.loads(msg["tool_calls"][0]["function"]["arguments"])
            else:
                assert finish == "length" and msg["content"].startswith(opening), (finish, msg)
            # streamed: a call as tool_calls deltas, or the opening and what followed (not compared token for
            # token with the answer above: the second request reads its prompt from the cache)
            text, calls = "", 0
            with httpx.stream("POST", s.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as st:
                assert st.status_code == 200
                for line in st.iter_lines():
                    if line.startswith("data: {"):
                        d = json.loads(line[6:])["choices"][0]["delta"]
                        text += d.get("content") or ""
                        for tc in d.get("tool_calls") or []:
                            assert not tc.get("id") or tc["function"]["name"] == "get_weather", tc
                            calls += bool(tc.get("id"))
            assert calls or text.startswith(opening), text
            a = httpx.post(s.url + "/v1/messages", json={"model": "m", "max_tokens": 24, "messages": ASK,
                                                         "tools": ATOOLS, "temperature": 0,
                                                         "tool_choice": {"type": "tool", "name": "get_weather"}},
                           headers={"anthropic-version": "2023-06-01"}, timeout=60)
            assert a.status_code == 200, a.text
            blocks = a.json()["content"]
            assert any(b["type"] == "tool_use" for b in blocks) or blocks[0]["text"].startswith(opening), blocks
            auto = httpx.post(s.url + "/v1/chat/completions", json={**body, "tool_choice": "auto"}, timeout=60)
            assert auto.status_code == 200, auto.text
            seen.append(f"{fam}: " + (msg["tool_calls"][0]["function"]["arguments"] if msg.get("tool_calls")
                                      else repr(msg["content"])))
        finally:
            assert s.stop() == 0
    print("checked: markup families from the template, forced calls opened in their markup:", seen)


# DeepSeek's tool-call markers, one control token each in its vocabulary (llama.cpp's conversions)
DS = ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"]


def deepseek_model(src, dst, template, ids):
    """A copy of the GGUF src whose chat template is template and whose control tokens ids get DeepSeek's
    markers as their text: the header re-written (the two keys), the tensor data copied as it is."""
    import struct
    data = open(src, "rb").read()
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(p):
        n, = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n], p + 8 + n

    def enc(b):
        return struct.pack("<Q", len(b)) + b

    out, pos, align = [data[:24]], 24, 32
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        typ, = struct.unpack_from("<I", data, pos)
        val = pos = pos + 4
        if typ == 8:
            _, pos = string(pos)
        elif typ == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if et == 8:
                items = []
                for _ in range(n):
                    s, pos = string(pos)
                    items.append(s)
            else:
                pos += n * sizes[et]
        else:
            pos += sizes[typ]
        if key == b"general.alignment":
            align, = struct.unpack_from("<I", data, val)
        if key == b"tokenizer.chat_template":
            out.append(data[start:val] + enc(template.encode()))
        elif key == b"tokenizer.ggml.tokens":
            for i, text in zip(ids, DS):
                items[i] = text.encode()
            out.append(data[start:val] + struct.pack("<IQ", 8, len(items)) + b"".join(map(enc, items)))
        else:
            out.append(data[start:pos])
    infos = pos
    for _ in range(n_tensors):
        _, pos = string(pos)
        nd, = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 4 + 8
    head = b"".join(out) + data[infos:pos]
    with open(dst, "wb") as f:
        f.write(head + b"\0" * (-len(head) % align) + data[(pos + align - 1) // align * align:])


def test_deepseek_family(tmp_path):
    """DeepSeek V3's real template (tests/data/jinja/templates) on a copy of the model whose control tokens
    3..7 are DeepSeek's markers: the server takes the V3 family, describes the tools in DeepSeek's shape
    and renders earlier calls with the template; calls come back as tool_calls / tool_use, the markers
    written as one token each (the engine renders them as text, the grammars see their text). The tool's
    only argument is an enum, so that what the 135M model may write is short. The parser and the grammars
    are unit-tested in test_tools_parse.c."""
    from conftest import MODEL, Server
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmpl = open(os.path.join(tests, "data", "jinja", "templates", "deepseek_v3.jinja"), encoding="utf-8").read()
    ids = [3, 4, 5, 6, 7]
    model = tmp_path / "deepseek_v3.gguf"
    deepseek_model(MODEL, model, tmpl.rstrip("\n"), ids)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"]}}}]
    s = Server("--slots", "1", "-m", str(model))
    try:
        tok = lambda t: httpx.post(s.url + "/tokenize", json={"content": t}).json()["tokens"]
        assert tok("".join(DS)) == ids  # the markers are the control tokens
        post = lambda body: httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)
        # forced (the model may reason first: the grammar starts with the opening, the model writes it); a
        # logit bias makes the 135M model write the markers as a real DeepSeek does, one token each
        bias = {str(i): 100 for i in ids}
        forced = {"messages": ASK, "tools": tools, "temperature": 0, "max_tokens": 60, "n_probs": 1,
                  "logit_bias": bias, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        r = post(forced)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None, ch
        call = ch["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_"), call
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Oslo"), call
        written = [t["id"] for t in r.json()["completion_probabilities"]]
        assert [i for i in written if i in ids] == ids, written
        # auto: the model opens a block itself, the lazy grammar holds the call (a second call is not
        # biased: <｜tool▁call▁begin｜> is left out); streamed as tool_calls deltas
        bias.pop(str(ids[1]))
        auto = {"messages": ASK, "tools": tools, "temperature": 0, "max_tokens": 60, "logit_bias": bias}
        calls, content, finish = {}, "", None
        with httpx.stream("POST", s.url + "/v1/chat/completions", json={**auto, "stream": True}, timeout=60) as st:
            assert st.status_code == 200
            for line in st.iter_lines():
                if line.startswith("data: {"):
                    c = json.loads(line[6:])["choices"][0]
                    content += c["delta"].get("content") or ""
                    for tc in c["delta"].get("tool_calls") or []:
                        if tc.get("id"):
                            calls[tc["index"]] = [tc["function"]["name"], ""]
                        else:
                            calls[tc["index"]][1] += tc["function"]["arguments"]
                    finish = c.get("finish_reason") or finish
        assert finish == "tool_calls" and content == "" and calls and all(
            n == "get_weather" and json.loads(a)["city"] in ("Paris", "Oslo") for n, a in calls.values()), \
            (finish, content, calls)
        # auto, answered in prose: the end of generation (SmolLM2's <|endoftext|>, id 0, not the chat's stop
        # string) ends the answer and is not written into it, though control tokens are rendered as text
        r = post({"messages": ASK, "tools": tools, "temperature": 0, "max_tokens": 8, "logit_bias": {"0": 100}})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "stop" and "<|endoftext|>" not in (ch["message"]["content"] or ""), ch
        # the reasoning not parsed: the opening is written into the prompt
        r = post({**forced, "tool_choice": "required", "reasoning_format": "none", "logit_bias": {}})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls", r.text
        assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather", r.text
        # Anthropic, forced to any tool; no bias: the model spells the markers out, which parse the same
        a = httpx.post(s.url + "/v1/messages", json={"model": "m", "max_tokens": 120, "messages": ASK,
                                                     "tools": [{"name": "get_weather",
                                                                "input_schema": tools[0]["function"]["parameters"]}],
                                                     "temperature": 0, "tool_choice": {"type": "any"}},
                       headers={"anthropic-version": "2023-06-01"}, timeout=60)
        assert a.status_code == 200, a.text
        use = [b for b in a.json()["content"] if b["type"] == "tool_use"]
        assert a.json()["stop_reason"] == "tool_use" and use[0]["name"] == "get_weather", a.json()
        # history: the template writes the earlier call and its result itself (content null beside calls)
        hist = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
        h = post({"messages": hist, "tools": tools, "max_tokens": 1})
        assert h.status_code == 200, h.text
        base = post({"messages": ASK, "tools": tools, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        native = (DS[0] + DS[1] + "function" + DS[2] + "get_weather\n```json\n{\"city\":\"Paris\"}\n```" + DS[3] +
                  DS[4] + "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C"
                  "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")
        assert h.json()["usage"]["prompt_tokens"] - base == len(tok(native)), (h.json()["usage"], base)
        print(f"checked: deepseek v3 family: forced {call['function']['arguments']} in {len(written)} tokens, "
              f"the markers among them; auto streamed {calls}; anthropic {use[0]['input']}; history rendered by "
              f"the template (+{len(tok(native))} tokens)")
    finally:
        assert s.stop() == 0
