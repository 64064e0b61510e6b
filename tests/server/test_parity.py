"""What llama-server's clients read, on a real `strata serve` (issue 17 item
12, the parts built so far): GET /props, `timings` in OpenAI responses, a
request id on every answer (the client's own echoed when it is a plain
token), the request fields `n_predict`, `ignore_eos` and `cache_prompt`, and Retry-After on 503/529 (checked in test_hostile.py's queue-full
test, where those answers come)."""
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
