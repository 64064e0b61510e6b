"""What llama-server's clients read, on a real `strata serve` (issue 17 item
12, the parts built so far): GET /props, `timings` in OpenAI responses, a
request id on every answer (the client's own echoed when it is a plain
token), the request fields `n_predict`, `ignore_eos` and `cache_prompt`, and Retry-After on 503/529 (checked in test_hostile.py's queue-full
test, where those answers come); GET /slots with `id_slot` and the KV gauges of /metrics; Anthropic's
required `anthropic-version` header and `model`; `chat_template_kwargs`. The sampling fields are
test_sampling.py's."""
from conftest import httpx


def test_props(server):
    r = httpx.get(server.url + "/props", timeout=10)
    assert r.status_code == 200, r.text
    p = r.json()
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert p["model_alias"] == models["id"] and p["n_ctx"] == models["context_length"], (p, models)
    assert p["total_slots"] >= 1 and p["default_generation_settings"]["n_ctx"] == p["n_ctx"], p
    assert isinstance(p["chat_template"], str) and "messages" in p["chat_template"], p["chat_template"][:200]
    assert httpx.post(server.url + "/props", json={}, timeout=10).status_code == 405
    print(f"checked: /props names {p['model_alias']}, n_ctx {p['n_ctx']}, {p['total_slots']} slot(s), its template")


def test_timings(server):
    for path, body in [("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 5}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})]:
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        d = r.json()
        t, u = d["timings"], d["usage"]
        assert t["predicted_n"] == u["completion_tokens"], (t, u)
        assert t["prompt_n"] + t["cache_n"] == u["prompt_tokens"], (t, u)
        assert t["cache_n"] == u["prompt_tokens_details"]["cached_tokens"], (t, u)
        assert t["prompt_ms"] >= 0 and t["predicted_ms"] > 0 and t["predicted_per_second"] > 0, t
        assert abs(t["predicted_per_token_ms"] * t["predicted_n"] - t["predicted_ms"]) < 1e-6 * t["predicted_ms"] + 1e-9, t
    print("checked: timings agree with usage on both OpenAI paths")


def test_request_id(server):
    ids = set()
    for _ in range(3):
        r = httpx.get(server.url + "/v1/models", timeout=10)
        rid = r.headers.get("x-request-id", "")
        assert rid.startswith("req_") and len(rid) > 10, r.headers
        ids.add(rid)
    assert len(ids) == 3, ids
    r = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "trace-42.a_b:c"}, timeout=10)
    assert r.headers["x-request-id"] == "trace-42.a_b:c", r.headers
    r = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "not plain <script>"}, timeout=10)
    assert r.headers["x-request-id"].startswith("req_"), r.headers  # not echoed: made anew
    r = httpx.get(server.url + "/no/such/path", timeout=10)
    assert r.status_code == 404 and r.headers["x-request-id"].startswith("req_"), r.headers
    print("checked: every answer carries a request id, unique, the client's own echoed only when plain")


def test_n_predict_and_ignore_eos(server):
    def complete(**kw):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "The capital of France is", "temperature": 0,
                                                             **kw}, timeout=120)
        return r
    r = complete(max_tokens=40, ignore_eos=True)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["usage"]["completion_tokens"] == 40 and d["choices"][0]["finish_reason"] == "length", d
    r = complete(n_predict=3, ignore_eos=True)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    r = complete(n_predict=5, max_tokens=2, ignore_eos=True)  # the smaller limit wins
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    r = complete(n_predict=0)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict", r.text
    r = complete(ignore_eos="yes")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_type", r.text
    print("checked: ignore_eos runs to max_tokens; n_predict limits (the smaller of it and max_tokens); bad values 400")


def test_cache_prompt(server):
    body = {"prompt": "In the beginning God created the heaven and the earth. And the earth was",
            "max_tokens": 2, "temperature": 0}
    first = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    again = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]  # the default reuses
    fresh = httpx.post(server.url + "/v1/completions", json={**body, "cache_prompt": False}, timeout=60).json()
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, fresh["usage"]
    assert fresh["timings"]["prompt_n"] == fresh["usage"]["prompt_tokens"], fresh
    assert fresh["choices"][0]["text"] == again["choices"][0]["text"], (fresh, again)
    r = httpx.post(server.url + "/v1/completions", json={**body, "cache_prompt": "no"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_prompt", r.text
    print(f"checked: cache_prompt false reads all {fresh['usage']['prompt_tokens']} prompt tokens again "
          f"(the default reused {again['usage']['prompt_tokens_details']['cached_tokens']}), same text")


def test_anthropic_required(server, anth):
    msgs = [{"role": "user", "content": "Hi"}]
    for path, body in [("/v1/messages", {"model": "m", "max_tokens": 2, "messages": msgs}),
                       ("/v1/messages/count_tokens", {"model": "m", "messages": msgs})]:
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400, r.text
        e = r.json()
        assert e["type"] == "error" and e["error"]["type"] == "invalid_request_error", e
        assert "anthropic-version" in e["error"]["message"], e
        hdr = {"anthropic-version": "2023-06-01"}
        r = httpx.post(server.url + path, json={k: v for k, v in body.items() if k != "model"}, headers=hdr, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model: Field required", r.text
        r = httpx.post(server.url + path, json=body, headers=hdr, timeout=60)
        assert r.status_code == 200, r.text
    # the official SDK sends both: it keeps working
    m = anth.messages.create(model="m", max_tokens=2, messages=msgs)
    assert m.content and anth.messages.count_tokens(model="m", messages=msgs).input_tokens > 0
    print("checked: /v1/messages and count_tokens without anthropic-version or model -> 400 naming it; the SDK works")


def test_slots_and_kv_gauge(server):
    props = httpx.get(server.url + "/props", timeout=10).json()
    n_slots, n_ctx = props["total_slots"], props["n_ctx"]
    assert n_slots >= 2, props
    ids = {}
    # the second request to slot 0 has another prompt: unpinned it would go to the least recently used slot, 1
    for slot, prompt in ((0, "Slot zero says"), (0, "A different text entirely"), (1, "Slot one says")):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 3,
                                                             "temperature": 0, "id_slot": slot}, timeout=60)
        assert r.status_code == 200, r.text
        ids[slot] = (r.json()["id"], r.json()["usage"])
    slots = httpx.get(server.url + "/slots", timeout=10).json()
    assert [s["id"] for s in slots] == list(range(n_slots)), slots
    for slot, (rid, usage) in ids.items():
        s = slots[slot]
        assert s["id_task"] == rid and s["n_ctx"] == n_ctx and s["is_processing"] is False, s
        assert s["n_prompt_tokens"] == usage["prompt_tokens"] and s["next_token"]["n_decoded"] == usage["completion_tokens"], s
        # the cache holds the prompt and every generated token but the last (never read back)
        assert s["n_cached_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1, (s, usage)
    m = server.metrics()
    total = sum(s["n_cached_tokens"] for s in slots)
    assert m["strata_kv_cache_tokens"] == total, (m["strata_kv_cache_tokens"], total)
    assert abs(m["strata_kv_cache_usage_ratio"] - total / (n_slots * n_ctx)) < 1e-6, m["strata_kv_cache_usage_ratio"]
    for bad in (n_slots, -2, "0"):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1, "id_slot": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "id_slot", (bad, r.text)
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                              "max_tokens": 1, "id_slot": -1}, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.post(server.url + "/slots", json={}, timeout=10).status_code == 405
    print(f"checked: /slots shows {n_slots} slots, the pinned requests where id_slot put them, their cached tokens; "
          f"KV gauge {total} tokens = {m['strata_kv_cache_usage_ratio']:.4f}; bad id_slot -> 400")


def test_chat_template_kwargs(tmp_path):
    """A copy of the model whose template (patched in place, same length) writes its system prompt from
    enable_thinking: the kwarg reaches the template, and what the server sets itself still wins."""
    from conftest import MODEL, Server
    data = open(MODEL, "rb").read()
    old = b"You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    new = b"' + ('THINKING ON' if enable_thinking else 'off') + '"
    new += b" " * (len(old) - len(new))  # inside the template's string literal... kept the same length
    assert data.count(old) == 1 and len(new) == len(old)
    model = tmp_path / "kw.gguf"
    model.write_bytes(data.replace(old, new))
    s = Server("--slots", "1", "-m", str(model))
    try:
        def prompt_tokens(**kw):
            r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                                 "max_tokens": 1, **kw}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]
        off = prompt_tokens()
        on = prompt_tokens(chat_template_kwargs={"enable_thinking": True})
        assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == off
        assert on > off, (on, off)
        # the server's own variables are not the client's to change
        assert prompt_tokens(chat_template_kwargs={"add_generation_prompt": False, "messages": []}) == off
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                             "chat_template_kwargs": [1]}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    finally:
        assert s.stop() == 0
    print(f"checked: chat_template_kwargs enable_thinking reaches the template ({off} -> {on} prompt tokens)")
