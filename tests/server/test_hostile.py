"""Hostile and malformed requests: each must get its status in the API's own
error shape (never a 500, never a crash), and a normal request must still
succeed afterwards. Also the API key, and 503 when the queue is full."""
import json
import threading

import pytest

from conftest import CTX, httpx, Server

OK_MSGS = [{"role": "user", "content": "Hi"}]


def chat(**kw):
    return {"messages": OK_MSGS, "max_tokens": 2, **kw}


# (name, path, raw body bytes, expected status, expected OpenAI code or Anthropic type)
CASES = [
    ("invalid JSON", "/v1/chat/completions", b'{"messages": [', 400, "invalid_json"),
    ("invalid UTF-8", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', 400,
     "invalid_json"),
    ("NUL escape", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\\u0000b"}]}', 400,
     "invalid_json"),
    ("empty body", "/v1/chat/completions", b"", 400, "invalid_json"),
    ("array root", "/v1/chat/completions", b"[1,2]", 400, "invalid_json"),
    ("duplicate key", "/v1/chat/completions", b'{"max_tokens":1,"max_tokens":2,"messages":[]}', 400, "invalid_json"),
    ("nested 10000 deep", "/v1/chat/completions", b"[" * 10000 + b"]" * 10000, 400, "invalid_json"),
    ("nested object", "/v1/chat/completions", b'{"a":' * 10000 + b"1" + b"}" * 10000, 400, "invalid_json"),
    ("huge integer", "/v1/chat/completions", b'{"messages":[],"max_tokens":99999999999999999999999}', 400,
     "invalid_json"),
    ("messages a string", "/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400, "invalid_value"),
    ("messages missing", "/v1/chat/completions", b"{}", 400, "missing_required_parameter"),
    ("message not an object", "/v1/chat/completions", json.dumps({"messages": [5]}).encode(), 400, "invalid_type"),
    ("bad role", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
     400, "invalid_value"),
    ("content a number", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
     400, "invalid_type"),
    ("image content", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}).encode(), 400, "unsupported_content"),
    ("temperature a string", "/v1/chat/completions", json.dumps(chat(temperature="hot")).encode(), 400,
     "invalid_type"),
    ("temperature 5", "/v1/chat/completions", json.dumps(chat(temperature=5)).encode(), 400, "invalid_value"),
    ("max_tokens a string", "/v1/chat/completions", json.dumps(chat(max_tokens="10")).encode(), 400,
     "invalid_type"),
    ("max_tokens 1.5", "/v1/chat/completions", json.dumps(chat(max_tokens=1.5)).encode(), 400, "invalid_type"),
    ("negative max_tokens", "/v1/chat/completions", json.dumps(chat(max_tokens=-5)).encode(), 400, "invalid_value"),
    ("negative max_completion_tokens", "/v1/chat/completions", json.dumps(chat(max_completion_tokens=-1)).encode(),
     400, "invalid_value"),
    ("stop a number", "/v1/chat/completions", json.dumps(chat(stop=5)).encode(), 400, "invalid_type"),
    ("stop list of numbers", "/v1/chat/completions", json.dumps(chat(stop=[1, 2])).encode(), 400, "invalid_type"),
    ("stream a string", "/v1/chat/completions", json.dumps(chat(stream="yes")).encode(), 400, "invalid_type"),
    ("seed a string", "/v1/chat/completions", json.dumps(chat(seed="x")).encode(), 400, "invalid_type"),
    ("model a number", "/v1/chat/completions", json.dumps(chat(model=5)).encode(), 400, "invalid_type"),
    ("unknown parameter", "/v1/chat/completions", json.dumps(chat(frobnicate=1)).encode(), 400,
     "unknown_parameter"),
    ("tools not an array", "/v1/chat/completions", json.dumps(chat(tools={"type": "function"})).encode(), 400,
     "invalid_type"),
    ("tool without a function", "/v1/chat/completions", json.dumps(chat(tools=[{"type": "function"}])).encode(), 400,
     "invalid_type"),
    ("tool name with a space", "/v1/chat/completions", json.dumps(chat(tools=[{"type": "function", "function": {
        "name": "f g"}}])).encode(), 400, "invalid_value"),
    ("tool name twice", "/v1/chat/completions", json.dumps(chat(tools=[{"type": "function", "function": {
        "name": "f"}}] * 2)).encode(), 400, "invalid_value"),
    ("tool_choice names an absent tool", "/v1/chat/completions", json.dumps(chat(tools=[{"type": "function",
        "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}})).encode(), 400,
     "invalid_value"),
    ("tool_choice required without tools", "/v1/chat/completions", json.dumps(chat(tool_choice="required")).encode(),
     400, "invalid_value"),
    ("tool message without tool_call_id", "/v1/chat/completions", json.dumps(chat(messages=[
        {"role": "tool", "content": "x"}])).encode(), 400, "missing_required_parameter"),
    ("tool_calls in a user message", "/v1/chat/completions", json.dumps(chat(messages=[
        {"role": "user", "content": "x", "tool_calls": []}])).encode(), 400, "invalid_value"),
    ("malformed tool call in history", "/v1/chat/completions", json.dumps(chat(messages=[
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 5}}]}])).encode(), 400, "invalid_type"),
    ("functions (deprecated)", "/v1/chat/completions", json.dumps(chat(functions=[{"name": "f"}])).encode(), 400,
     "unsupported_parameter"),
    ("n=2 (unsupported)", "/v1/chat/completions", json.dumps(chat(n=2)).encode(), 400, "unsupported_parameter"),
    ("top_logprobs without logprobs", "/v1/chat/completions", json.dumps(chat(top_logprobs=2)).encode(), 400,
     "invalid_value"),
    ("top_logprobs 21", "/v1/chat/completions", json.dumps(chat(logprobs=True, top_logprobs=21)).encode(), 400,
     "invalid_value"),
    ("json_schema (unsupported)", "/v1/chat/completions", json.dumps(chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x"}})).encode(), 400, "unsupported_parameter"),
    ("json mode with tools", "/v1/chat/completions", json.dumps(chat(response_format={"type": "json_object"},
        tools=[{"type": "function", "function": {"name": "f"}}])).encode(), 400, "invalid_value"),
    ("stream_options without stream", "/v1/chat/completions",
     json.dumps(chat(stream_options={"include_usage": True})).encode(), 400, "invalid_value"),
    ("prompt beyond the context", "/v1/chat/completions",
     json.dumps(chat(messages=[{"role": "user", "content": "word " * (CTX * 2)}])).encode(), 400,
     "context_length_exceeded"),
    ("1000 messages", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
                              for i in range(1000)], "max_tokens": 1}).encode(), 400, "context_length_exceeded"),
    ("completion prompt a number", "/v1/completions", json.dumps({"prompt": 5}).encode(), 400, "invalid_type"),
    ("completion empty prompt", "/v1/completions", json.dumps({"prompt": ""}).encode(), 400, "invalid_value"),
    ("completion bad token id", "/v1/completions", json.dumps({"prompt": [1, -4]}).encode(), 400, "invalid_value"),
    ("completion 2 prompts", "/v1/completions", json.dumps({"prompt": ["a", "b"]}).encode(), 400,
     "unsupported_parameter"),
    ("detokenize bad id", "/detokenize", json.dumps({"tokens": [10 ** 9]}).encode(), 400, "invalid_value"),
    ("tokenize no content", "/tokenize", b"{}", 400, "missing_required_parameter"),
    # Anthropic paths answer in Anthropic's shape
    ("anthropic invalid JSON", "/v1/messages", b"{nope", 400, "invalid_request_error"),
    ("anthropic max_tokens missing", "/v1/messages", json.dumps({"model": "m", "messages": OK_MSGS}).encode(), 400,
     "invalid_request_error"),
    ("anthropic negative max_tokens", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": -1, "messages": OK_MSGS}).encode(), 400, "invalid_request_error"),
    ("anthropic system role in messages", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}).encode(), 400,
     "invalid_request_error"),
    ("anthropic stop_sequences a string", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 2, "messages": OK_MSGS, "stop_sequences": "x"}).encode(), 400,
     "invalid_request_error"),
    ("anthropic temperature 1.5", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 2, "messages": OK_MSGS, "temperature": 1.5}).encode(), 400,
     "invalid_request_error"),
    ("anthropic unknown field", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 2, "messages": OK_MSGS, "wat": 1}).encode(), 400,
     "invalid_request_error"),
    ("anthropic prompt beyond the context", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "word " * (CTX * 2)}]})
     .encode(), 400, "invalid_request_error"),
    ("anthropic count_tokens bad messages", "/v1/messages/count_tokens",
     json.dumps({"model": "m", "messages": {}}).encode(), 400, "invalid_request_error"),
    ("unknown path", "/v1/nothing", b"{}", 404, "not_found"),
]


def check_shape(path, r, want):
    assert r.headers["content-type"] == "application/json", r.headers
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == want and body["error"]["message"], body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["code"] == want and body["error"]["message"], body


@pytest.mark.parametrize("name,path,raw,status,want", CASES, ids=[c[0] for c in CASES])
def test_hostile(server, name, path, raw, status, want):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    check_shape(path, r, want)
    print(f"checked: {name} -> {r.status_code} {r.json()}"[:300])


def test_body_100mb_gets_413(server):
    big = b'{"messages": "' + b"a" * (100 << 20) + b'"}'
    r = httpx.post(server.url + "/v1/chat/completions", content=big, timeout=60)
    assert r.status_code == 413, r.text[:200]
    check_shape("/v1/chat/completions", r, "request_too_large")
    r = httpx.post(server.url + "/v1/messages", content=big, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    print("checked: 100 MB body -> 413 in both shapes")


def test_wrong_method(server):
    r = httpx.get(server.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    print("checked: GET on a POST path -> 405")


def test_unknown_model_name_is_served(server, oai):
    # policy: one model per server; any model name is accepted and the
    # response names the model that answered
    r = oai.chat.completions.create(model="gpt-4o-nonexistent", messages=OK_MSGS, max_tokens=2)
    assert r.model == "SmolLM2-135M-Instruct.Q4_1"
    assert httpx.get(server.url + "/v1/models/gpt-4o-nonexistent").status_code == 404
    print("checked: unknown model name answered by", r.model, "; GET /v1/models/<unknown> -> 404")


def test_still_healthy_after_hostile(server, oai):
    r = oai.chat.completions.create(model="any", messages=OK_MSGS, max_tokens=3, temperature=0)
    assert r.choices[0].message.content is not None and r.usage.completion_tokens >= 1
    assert server.alive()
    m = server.metrics()
    assert m['strata_http_requests_total{code="500"}'] == 0, m
    print("checked: normal request after the hostile table succeeds; no 500 answered;",
          int(m['strata_http_requests_total{code="400"}']), "400s counted")


@pytest.fixture(scope="module")
def keyed():
    s = Server("--slots", "1", "--queue", "1", "--api-key", "sekrit")
    yield s
    assert s.stop() == 0


def test_api_key(keyed):
    import anthropic
    import openai
    r = httpx.post(keyed.url + "/v1/chat/completions", json=chat())
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(keyed.url + "/v1/messages", json={"max_tokens": 2, "messages": OK_MSGS},
                   headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer sekri"}).status_code == 401
    assert httpx.get(keyed.url + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()
    o = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sekrit", max_retries=0)
    assert o.chat.completions.create(model="m", messages=OK_MSGS, max_tokens=2).usage.completion_tokens >= 1
    a = anthropic.Anthropic(base_url=keyed.url, api_key="sekrit", max_retries=0)
    assert a.messages.create(model="m", max_tokens=2, messages=OK_MSGS).usage.output_tokens >= 1
    print("checked: 401 without or with a wrong key (both shapes), /health open, both SDKs work with the key")


def test_queue_full_503(keyed):
    hdr = {"Authorization": "Bearer sekrit"}
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400, "stream": True}
    queued = {}
    with httpx.stream("POST", keyed.url + "/v1/chat/completions", json=body, headers=hdr, timeout=60) as r:
        it = r.iter_lines()
        while not next(it).startswith("data: {"):  # the one slot is generating now
            pass

        def waiter():
            queued["r"] = httpx.post(keyed.url + "/v1/chat/completions", json=chat(), headers=hdr, timeout=60)

        t = threading.Thread(target=waiter)
        t.start()
        keyed.wait_metric("strata_queue_depth", lambda v: v == 1, headers=hdr)
        r3 = httpx.post(keyed.url + "/v1/chat/completions", json=chat(), headers=hdr)
        assert r3.status_code == 503 and r3.json()["error"]["code"] == "overloaded", r3.text
        r4 = httpx.post(keyed.url + "/v1/messages", json={"max_tokens": 2, "messages": OK_MSGS}, headers=hdr)
        assert r4.status_code == 503 and r4.json()["error"]["type"] == "overloaded_error", r4.text
    # leaving the stream frees the slot, and the queued request runs
    t.join(60)
    assert queued["r"].status_code == 200, queued["r"].text
    print("checked: with 1 slot busy and 1 request queued, the next gets 503 (both shapes); "
          "the queued one succeeds once the stream is dropped")
