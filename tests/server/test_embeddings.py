"""Embeddings (issue 17, item 12): POST /v1/embeddings through the official openai SDK and llama-server's
/embedding, on the default model (a decoder without a pooling type: the mean of the final hidden states,
normalized to unit length).

What makes the vectors right and not merely plausible: the last token's raw vector (pooling last,
embd_normalize -1) times the model's output matrix (its tied token embedding, dequantized here by the gguf
package) must give the same next-token distribution as the engine's own n_probs for that prompt (the
same 5 tokens, log probabilities within 0.1: the engine quantizes activations for its products). The mean
is then checked against the per-token vectors (pooling none), base64 against floats, ids against text,
one input against many. And the bounds: every limit is a 400 before anything runs."""
import base64
import struct
import time

import numpy as np
import pytest

from conftest import CTX, MODEL, httpx

CAT, CAT2, MONEY = "The cat sat on the mat.", "A cat is sitting on a mat.", "Quarterly revenue grew five percent."


def gguf_tensor(path, name):
    """(ggml type, shape, raw bytes) of one tensor, reading only the header (GGUFReader parses every field,
    about 6 s for this model's vocabulary)."""
    import gguf
    with open(path, "rb") as f:
        data = f.read(16 << 20)
    pos = 4

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return v

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t):
        nonlocal pos
        if t == 8:
            n = rd("Q")
            pos += n
        elif t == 9:
            et, n = rd("I"), rd("Q")
            if et == 8:
                for _ in range(n):
                    k = rd("Q")
                    pos += k
            else:
                pos += sizes[et] * n
        else:
            pos += sizes[t]

    assert data[:4] == b"GGUF"
    _, n_t, n_kv = rd("I"), rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        k = rd("Q")
        key = data[pos:pos + k].decode()
        pos += k
        t = rd("I")
        if key == "general.alignment":
            align = rd("I")
        else:
            skip(t)
    found = None
    for _ in range(n_t):
        k = rd("Q")
        nm = data[pos:pos + k].decode()
        pos += k
        shape = [rd("Q") for _ in range(rd("I"))]
        typ, off = rd("I"), rd("Q")
        if nm == name:
            found = typ, shape, off
    typ, shape, off = found
    base = (pos + align - 1) // align * align
    bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(typ)]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=base + off, shape=(int(np.prod(shape)) // bs * ts,))
    return gguf.GGMLQuantizationType(typ), shape, raw


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_sdk(server, oai):
    t0 = time.time()
    r = oai.embeddings.create(model="m", input=[CAT, CAT2, MONEY])  # the SDK asks for base64 and decodes it
    dt = time.time() - t0
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 576) and [d.index for d in r.data] == [0, 1, 2], v.shape
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5), np.linalg.norm(v, axis=1)
    n_tok = sum(len(post(server, "/tokenize", {"content": t}).json()["tokens"]) for t in (CAT, CAT2, MONEY))
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tok, r.usage
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.1 and sim[0, 1] > sim[1, 2] + 0.1, sim  # a sanity check of meaning
    f = oai.embeddings.create(model="m", input=CAT, encoding_format="float").data[0].embedding
    assert np.array_equal(np.float32(f), np.float32(v[0])), "float and base64 differ"
    ids = post(server, "/tokenize", {"content": CAT}).json()["tokens"]
    by_ids = oai.embeddings.create(model="m", input=[ids, CAT]).data
    assert np.allclose(by_ids[0].embedding, v[0], atol=1e-6) and np.allclose(by_ids[1].embedding, v[0], atol=1e-6)
    raw = post(server, "/v1/embeddings", {"input": CAT, "encoding_format": "base64"}).json()["data"][0]
    assert np.array_equal(np.frombuffer(base64.b64decode(raw["embedding"]), "<f4"), np.float32(v[0])), raw
    print(f"checked: 3 inputs -> unit vectors of 576 in {dt * 1e3:.0f} ms, cosine cat/cat {sim[0, 1]:.3f} vs "
          f"cat/revenue {sim[0, 2]:.3f}; base64 = float, ids = text, {n_tok} prompt tokens")


def test_vector_is_the_final_hidden_state(server):
    typ, shape, raw = gguf_tensor(MODEL, "token_embd.weight")  # SmolLM2 ties its output matrix to it
    import gguf
    w = gguf.quants.dequantize(raw, typ).reshape(shape[1], shape[0]).astype(np.float64)
    ids = post(server, "/tokenize", {"content": "The capital of France is"}).json()["tokens"]
    h = np.array(post(server, "/embedding", {"content": ids, "pooling": "last", "embd_normalize": -1})
                 .json()[0]["embedding"][0])
    lg = w @ h
    lp = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
    want = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0, "n_probs": 5}).json()
    top = want["completion_probabilities"][0]["top_logprobs"]
    mine = list(np.argsort(-lp)[:5])
    got = [t["id"] for t in top]
    # the engine's logits come from 8-bit activations (up to ~0.06 from these f64 ones here), so ids whose
    # f64 log-probs are closer than that may come in either order (ranks 4 and 5 of this prompt: 0.022
    # apart since the CPU attention's tiled products): the engine's five must be the f64 top five, in
    # order, up to such near-ties; a wrong vector (another token's, before the final norm) moves far more
    tol = 0.1
    assert all(lp[g] >= lp[mine[4]] - tol for g in got), (got, mine)
    assert all(lp[got[i]] >= lp[got[j]] - tol for i in range(5) for j in range(i + 1, 5)), (got, mine)
    diff = max(abs(t["logprob"] - lp[t["id"]]) for t in top)
    assert diff < tol, diff
    # the mean over the per-token vectors (pooling none, llama-server's shape: one row per token) is the
    # pooled vector; the last row is the last token's
    rows = np.array(post(server, "/embedding", {"content": ids, "pooling": "none"}).json()[0]["embedding"])
    assert rows.shape == (len(ids), 576) and np.allclose(rows[-1], h, atol=1e-6), rows.shape
    m = rows.mean(0)
    pooled = np.array(post(server, "/v1/embeddings", {"input": ids}).json()["data"][0]["embedding"])
    assert np.allclose(m / np.linalg.norm(m), pooled, atol=1e-6)
    legacy = post(server, "/embedding", {"content": ids}).json()
    assert len(legacy) == 1 and np.allclose(legacy[0]["embedding"][0], pooled, atol=1e-7), legacy[0].keys()
    taxi = np.array(post(server, "/embedding", {"content": ids, "embd_normalize": 1}).json()[0]["embedding"][0])
    assert abs(np.abs(taxi).sum() - 1) < 1e-5 and np.allclose(taxi / np.linalg.norm(taxi), pooled, atol=1e-6)
    print(f"checked: the last token's vector x the output matrix = the engine's next-token log probabilities "
          f"(top 5 the same, max diff {diff:.4f}); the mean of the {len(ids)} token rows = the pooled vector")


BAD = [
    ("no input", {}, "missing_required_parameter"),
    ("empty string", {"input": ""}, "invalid_value"),
    ("empty list", {"input": []}, "invalid_value"),
    ("a number", {"input": 5}, "invalid_type"),
    ("an object in the list", {"input": ["a", {"x": 1}]}, "invalid_type"),
    ("empty token list inside", {"input": ["a", []]}, "invalid_value"),
    ("token id outside the vocabulary", {"input": [1, 2, 10 ** 7]}, "invalid_value"),
    ("negative token id", {"input": [[5, -1]]}, "invalid_value"),
    ("2049 inputs", {"input": ["a"] * 2049}, "invalid_value"),
    ("an input beyond the context", {"input": [[1] * CTX]}, "context_length_exceeded"),
    ("a text beyond the context", {"input": ["word " * (CTX * 2)]}, "context_length_exceeded"),
    ("300k tokens in all", {"input": [[1] * (CTX - 1)] * (300000 // (CTX - 1) + 1)}, "invalid_value"),
    ("encoding_format hex", {"input": "a", "encoding_format": "hex"}, "invalid_value"),
    ("dimensions 100", {"input": "a", "dimensions": 100}, "unsupported_parameter"),
    ("unknown field", {"input": "a", "pooling": "mean"}, "unknown_parameter"),  # llama-server's path only
]


@pytest.mark.parametrize("name,body,code", BAD, ids=[b[0] for b in BAD])
def test_refused(server, name, body, code):
    t0 = time.time()
    r = post(server, "/v1/embeddings", body)
    assert r.status_code == 400 and r.json()["error"]["code"] == code, (name, r.status_code, r.text[:300])
    assert time.time() - t0 < 5, name


def test_refused_llama(server):
    for body, code in (({"content": "a", "pooling": "max"}, "invalid_value"),
                       ({"content": "a", "embd_normalize": 99}, "invalid_value"),
                       # one row per token: 4 inputs of 1000 tokens would be 2.3M numbers
                       ({"content": [[1] * 1000] * 4, "pooling": "none"}, "invalid_value")):
        r = post(server, "/embedding", body)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (body.keys(), r.text[:300])
    r = post(server, "/embedding", {"content": "a"})
    assert r.status_code == 200, r.text  # and the server still answers


def test_hybrid_model_state(tmp_path):
    """A DeltaNet hybrid (qwen3next, `strata synth` tiny: a recurrent state besides the KV cache) embeds too:
    each token's row depends on the tokens before it only (the rows of a prefix equal the first rows of the
    whole, read in other chunk sizes: --prefill 16), the same input gives the same rows, and a generation in
    the slot between two embeddings leaves no state behind."""
    from conftest import BIN, Server
    path = tmp_path / "q3n.gguf"
    import subprocess
    subprocess.run([BIN, "synth", "--arch", "qwen3next", "--preset", "tiny", "-o", str(path), "--quiet"], check=True)
    s = Server("-m", str(path), "--slots", "1", "--prefill", "16")
    try:
        ids = list(range(5, 45))  # 40 tokens: chunks of 16, 16, 8; the prefix of 20: 16, 4

        def rows(x):
            r = post(s, "/embedding", {"content": x, "pooling": "none"})
            assert r.status_code == 200, r.text
            return np.array(r.json()[0]["embedding"])
        a, b = rows(ids), rows(ids[:20])
        assert a.shape[0] == 40 and np.abs(a[:20] - b).max() < 1e-4, np.abs(a[:20] - b).max()
        assert post(s, "/v1/completions", {"prompt": ids[:30], "max_tokens": 3}).status_code == 200
        assert np.array_equal(rows(ids), a)
        print(f"checked: qwen3next tiny: prefix rows equal across chunkings (max diff "
              f"{np.abs(a[:20] - b).max():.1e}); the same rows after a generation in the slot")
    finally:
        assert s.stop() == 0
