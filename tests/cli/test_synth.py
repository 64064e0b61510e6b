"""strata synth / strata info against the gguf package (the reference reader).

Writes tiny synthetic qwen3moe files with the strata binary (STRATA_BIN) and
checks them with gguf.GGUFReader: llama.cpp's tensor names and shapes (the
formulas below are llama.cpp's qwen3moe loader, written out here, not taken
from the code under test), the per-class types, dequantized weights (finite,
std near 0.02, norms near 1), a tokenizer whose merges are consistent with
its tokens, determinism, the Zipf router, and the CLI's exit codes.
"""
import os
import subprocess

import numpy as np
import pytest

import gguf

BIN = os.environ.get("STRATA_BIN", "strata")
TMP = os.environ.get("STRATA_TMP", "/tmp")

# The tiny preset's shapes as docs/synth.md states them.
TINY = dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2,
            n_ff_exp=256, n_vocab=512)


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


def synth(name, *args):
    path = os.path.join(TMP, name)
    r = run("synth", "--preset", "tiny", "-o", path, "--quiet", *args)
    assert r.returncode == 0, r.stderr
    return path


def field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode("utf-8")
    return f.parts[-1][0].item()


def expected_tensors(h):
    """name -> ne (ggml order) per llama.cpp's qwen3moe load_tensors."""
    E, V, D = h["n_embd"], h["n_vocab"], h["head_dim"]
    Q, KV, X, F = h["n_head"] * D, h["n_head_kv"] * D, h["n_expert"], h["n_ff_exp"]
    t = {"token_embd.weight": [E, V], "output_norm.weight": [E], "output.weight": [E, V]}
    for i in range(h["n_layer"]):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": [E], b + "attn_q.weight": [E, Q], b + "attn_k.weight": [E, KV],
                  b + "attn_v.weight": [E, KV], b + "attn_output.weight": [Q, E],
                  b + "attn_q_norm.weight": [D], b + "attn_k_norm.weight": [D], b + "ffn_norm.weight": [E],
                  b + "ffn_gate_inp.weight": [E, X], b + "ffn_gate_exps.weight": [E, F, X],
                  b + "ffn_up_exps.weight": [E, F, X], b + "ffn_down_exps.weight": [F, E, X]})
    return t


def tensor_class(name):
    parts = name.split(".")
    if parts[0] == "blk":
        parts = parts[2:]
    return ".".join(parts[:-1]) if parts[-1] == "weight" else ".".join(parts)


@pytest.fixture(scope="module")
def tiny():
    return synth("synth_tiny.gguf")


def test_metadata_and_shapes(tiny):
    r = gguf.GGUFReader(tiny)
    a = "qwen3moe."
    assert field(r, "general.architecture") == "qwen3moe"
    got = {"n_layer": field(r, a + "block_count"), "n_embd": field(r, a + "embedding_length"),
           "n_head": field(r, a + "attention.head_count"), "n_head_kv": field(r, a + "attention.head_count_kv"),
           "head_dim": field(r, a + "attention.key_length"), "n_expert": field(r, a + "expert_count"),
           "n_expert_used": field(r, a + "expert_used_count"), "n_ff_exp": field(r, a + "expert_feed_forward_length"),
           "n_vocab": len(field(r, "tokenizer.ggml.tokens"))}
    assert got == TINY
    assert field(r, a + "attention.value_length") == TINY["head_dim"]
    assert abs(field(r, a + "rope.freq_base") - 1e6) < 1
    assert abs(field(r, a + "attention.layer_norm_rms_epsilon") - 1e-6) < 1e-9
    assert field(r, a + "context_length") > 0
    # llama.cpp's llama_ftype: the default mix is Q4_K_M (15), so llama-bench names the file's type
    assert field(r, "general.file_type") == 15
    want = expected_tensors(TINY)
    have = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert have == want
    print(f"checked {len(want)} tensor names and shapes against llama.cpp's qwen3moe layout")


def test_types_and_weights(tiny):
    r = gguf.GGUFReader(tiny)
    T = gguf.GGMLQuantizationType
    mix = {"attn_v": T.Q6_K, "ffn_down_exps": T.Q6_K, "output": T.Q6_K}
    f32 = {"attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "output_norm", "ffn_gate_inp"}
    for t in r.tensors:
        c = tensor_class(t.name)
        want = T.F32 if c in f32 else mix.get(c, T.Q4_K)
        assert t.tensor_type == want, (t.name, t.tensor_type.name)
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.all(np.isfinite(w)), t.name
        if c.endswith("norm"):
            assert abs(float(w.mean()) - 1) < 0.02 and float(w.std()) < 0.05, t.name
        else:
            assert 0.015 < float(w.std()) < 0.025 and abs(float(w.mean())) < 0.003, (t.name, w.std(), w.mean())
    print(f"checked types and dequantized statistics of {len(r.tensors)} tensors")


def test_type_overrides_and_fallback():
    p = synth("synth_types.gguf", "--type-default", "Q5_K", "--type", "ffn_down_exps=Q8_0",
              "--type", "ffn_gate_inp=F16", "--expert-ff", "96")
    r = gguf.GGUFReader(p)
    assert field(r, "general.file_type") == 16  # MOSTLY_Q5_K_S: Q5_K everywhere but the overrides
    T = gguf.GGMLQuantizationType
    for t in r.tensors:
        c = tensor_class(t.name)
        if c == "ffn_down_exps":
            want = T.Q8_0
        elif c == "ffn_gate_inp":
            want = T.F16
        elif c.endswith("norm"):
            want = T.F32
        elif c in ("ffn_gate_exps", "ffn_up_exps"):
            want = T.Q5_K   # rows of n_embd = 256 weights: Q5_K fits
        else:
            want = T.Q5_K
        assert t.tensor_type == want, (t.name, t.tensor_type.name)
        assert np.all(np.isfinite(gguf.quants.dequantize(t.data, t.tensor_type)))
    # a width of 96 cannot hold Q5_K's 256-weight blocks: Q5_0 instead
    p = synth("synth_fallback.gguf", "--expert-ff", "96")
    r = gguf.GGUFReader(p)
    kinds = {tensor_class(t.name): t.tensor_type for t in r.tensors}
    assert kinds["ffn_down_exps"] == T.Q8_0 and kinds["ffn_gate_exps"] == T.Q4_K
    print("checked --type-default, --type CLASS=TYPE and the 32-block fallback")


def gpt2_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def test_tokenizer(tiny):
    r = gguf.GGUFReader(tiny)
    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "qwen2"
    assert len(toks) == len(types) == TINY["n_vocab"] and len(set(toks)) == len(toks)
    assert set(toks[:256]) == set(gpt2_bytes_to_unicode().values())
    index = {t: i for i, t in enumerate(toks)}
    for m in merges:
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index, m
    assert toks[field(r, "tokenizer.ggml.bos_token_id")] == "<|endoftext|>"
    assert toks[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert "<|im_start|>" in index
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert types[index[s]] == 3
    assert sum(1 for t in types if t == 1) == len(toks) - 3
    print(f"checked {len(toks)} tokens, {len(merges)} merges consistent, specials")


def test_deterministic():
    a = synth("synth_seed_a.gguf", "--seed", "7")
    b = synth("synth_seed_b.gguf", "--seed", "7")
    c = synth("synth_seed_c.gguf", "--seed", "8")
    da, db, dc = (open(p, "rb").read() for p in (a, b, c))
    assert da == db and da != dc and len(da) == len(dc)
    print("same seed -> identical bytes; another seed -> different data")


def zipf_fit(path, layer, n_tokens=4000):
    """Route Gaussian hidden states h = m*u + N(0, I) (the model docs/synth.md
    states) through the router's top-k and fit the rank-frequency exponent
    over ranks 2.. (rank 1 may be capped: no expert can win more than once
    per token)."""
    r = gguf.GGUFReader(path)
    u = np.array(field(r, "strata.synth.router_dir"), dtype=np.float64)
    m = field(r, "strata.synth.router_dir_mean")
    k = field(r, "qwen3moe.expert_used_count")
    w = [t for t in r.tensors if t.name == f"blk.{layer}.ffn_gate_inp.weight"][0]
    W = gguf.quants.dequantize(w.data, w.tensor_type).astype(np.float64)   # (n_expert, n_embd)
    rng = np.random.default_rng(1234 + layer)
    h = m * u[None, :] + rng.standard_normal((n_tokens, W.shape[1]))
    logits = h @ W.T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)                               # softmax, as llama.cpp does
    top = np.argsort(-probs, axis=1)[:, :k]
    freq = np.sort(np.bincount(top.ravel(), minlength=W.shape[0]))[::-1] / n_tokens
    ranks = np.arange(1, len(freq) + 1)
    slope = np.polyfit(np.log(ranks[1:]), np.log(np.maximum(freq[1:], 0.5 / n_tokens)), 1)[0]
    return -slope, freq


@pytest.mark.parametrize("experts,used,s", [(8, 2, 1.0), (128, 8, 1.0), (64, 4, 2.0)])
def test_zipf(experts, used, s):
    p = synth(f"synth_zipf_{experts}_{s}.gguf", "--zipf", str(s), "--experts", str(experts),
              "--experts-used", str(used), "--seed", "3")
    for layer in range(2):
        fit, freq = zipf_fit(p, layer)
        print(f"experts {experts} top-{used} zipf {s}: layer {layer} fitted exponent {fit:.3f}, "
              f"top frequencies {np.round(freq[:4], 3)}")
        assert abs(fit - s) <= 0.3 * s


def test_flat_router_without_zipf(tiny):
    r = gguf.GGUFReader(tiny)
    assert "strata.synth.router_dir" not in r.fields
    k = field(r, "qwen3moe.expert_used_count")
    w = [t for t in r.tensors if t.name == "blk.0.ffn_gate_inp.weight"][0]
    W = np.asarray(w.data, dtype=np.float64)
    h = np.random.default_rng(5).standard_normal((4000, W.shape[1]))
    top = np.argsort(-(h @ W.T), axis=1)[:, :k]
    freq = np.bincount(top.ravel(), minlength=W.shape[0]) / 4000
    print("flat router frequencies", np.round(freq, 3))
    assert freq.max() < 2.5 * k / W.shape[0]


def test_info_reads_it(tiny):
    r = run("info", tiny)
    assert r.returncode == 0, r.stderr
    for c in ("token_embd", "attn_q", "attn_v", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
              "output_norm", "output"):
        assert any(line.split()[:1] == [c] for line in r.stdout.splitlines()), c
    import json
    j = json.loads(run("info", tiny, "--json", "--tensors").stdout)
    g = gguf.GGUFReader(tiny)
    assert len(j["tensors"]) == len(g.tensors)
    assert j["totals"]["bytes"] == sum(int(t.n_bytes) for t in g.tensors)
    assert j["totals"]["params"] == sum(int(t.n_elements) for t in g.tensors)
    byname = {c["class"]: c for c in j["classes"]}
    assert byname["ffn_down_exps"]["count"] == TINY["n_layer"] and byname["ffn_down_exps"]["types"] == ["Q6_K"]
    assert abs(byname["ffn_gate_exps"]["bpw"] - 4.5) < 1e-6 and abs(byname["ffn_down_exps"]["bpw"] - 6.5625) < 1e-6
    print("strata info: classes, totals and bpw agree with the gguf reader")


@pytest.mark.parametrize("args,code,msg", [
    (["synth", "--help"], 0, None),
    (["info", "--help"], 0, None),
    (["synth", "--preset", "tiny", "-o", "x", "--foo"], 2, "strata synth: unknown option '--foo'"),
    (["info", "--foo"], 2, "strata info: unknown option '--foo'"),
    (["synth", "--preset", "tiny", "-o"], 2, "missing value for '-o'"),
    (["synth", "--preset"], 2, "missing value for '--preset'"),
    (["synth", "--preset", "huge", "-o", "x"], 2, "unknown preset 'huge'"),
    (["synth", "--preset", "tiny", "-o", "x", "--type-default", "Q9_K"], 2, "unknown type 'Q9_K'"),
    (["synth", "--preset", "tiny", "-o", "x", "--type", "nope=Q4_K"], 2, "unknown tensor class 'nope'"),
    (["synth", "--preset", "tiny", "-o", "x", "--seed", "12x"], 2, "invalid value '12x' for --seed"),
    (["synth", "--preset", "tiny", "-o", "x", "--attn-out-scale", "0"], 2, "invalid value '0' for --attn-out-scale"),
    (["synth", "--arch", "llama", "--preset", "tiny", "-o", "x"], 2, "unknown architecture 'llama'"),
    (["info", "/nonexistent/file.gguf"], 1, "strata info: /nonexistent/file.gguf"),
])
def test_cli_errors(args, code, msg):
    r = run(*args)
    assert r.returncode == code, (args, r.returncode, r.stderr)
    if code == 0:
        assert r.stdout.startswith("usage: strata ")
    else:
        assert msg in r.stderr, r.stderr
        if code == 2:
            assert "\nusage: strata " in r.stderr
        else:
            assert len(r.stderr.strip().splitlines()) == 1


def test_attn_out_scale_spreads_routing():
    """Random attention adds the same vector to every position, so deeper
    layers' tokens choose alike; --attn-out-scale 0.1 keeps a 512-token
    chunk's choices spread (strata profile's counts of the last of 6 layers
    of the moe-1.5g shape: 23 of 64 experts by default, 64 scaled)."""
    text = os.path.join(TMP, "synth_genesis_3k.txt")
    src = os.path.join(os.path.dirname(__file__), "..", "data", "text", "kjv-genesis.txt")
    open(text, "w").write(open(src).read()[:3000])
    distinct = {}
    for scale in ("1", "0.1"):
        path = os.path.join(TMP, "synth_attn_%s.gguf" % scale)
        r = run("synth", "--preset", "moe-1.5g", "--layers", "6", "--attn-out-scale", scale, "-o", path, "--quiet")
        assert r.returncode == 0, r.stderr
        keys = gguf.GGUFReader(path).fields
        assert ("strata.synth.attn_out_scale" in keys) == (scale != "1")
        prof = path + ".prof"
        r = run("profile", "-m", path, "-f", text, "-o", prof, "--chunks", "1", "-t", "2")
        assert r.returncode == 0, r.stderr
        rows = [[int(x) for x in line.split()] for line in open(prof).read().splitlines()[2:] if line.strip()]
        assert len(rows) == 6 and all(sum(row) == 512 * 8 for row in rows)
        distinct[scale] = [sum(1 for x in row if x > 0) for row in rows]
        os.remove(path)
        os.remove(prof)
    print("distinct experts per layer of a 512-token chunk, default / 0.1:", distinct["1"], distinct["0.1"])
    assert distinct["1"][-1] <= 40 and min(distinct["0.1"]) >= 58


def test_info_bad_file(tiny):
    data = open(tiny, "rb").read()
    p = os.path.join(TMP, "synth_truncated.gguf")
    open(p, "wb").write(data[:5000])
    r = run("info", p)
    assert r.returncode == 1 and r.stderr.startswith("strata info: ") and len(r.stderr.strip().splitlines()) == 1
    print("truncated file:", r.stderr.strip())


def expected_hybrid(arch, L=4, E=256, H=4, HKV=2, D=64, NK=2, NV=4, S=64, K=4, X=8, F=256, FS=256, V=512):
    """name -> ne per llama.cpp's qwen35moe / qwen3next load_arch_tensors (every 4th layer attention)."""
    conv, vd = 2 * NK * S + NV * S, NV * S
    t = {"token_embd.weight": [E, V], "output_norm.weight": [E], "output.weight": [E, V]}
    for i in range(L):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": [E], b + "post_attention_norm.weight": [E],
                  b + "ffn_gate_inp.weight": [E, X], b + "ffn_gate_exps.weight": [E, F, X],
                  b + "ffn_up_exps.weight": [E, F, X], b + "ffn_down_exps.weight": [F, E, X],
                  b + "ffn_gate_inp_shexp.weight": [E], b + "ffn_gate_shexp.weight": [E, FS],
                  b + "ffn_up_shexp.weight": [E, FS], b + "ffn_down_shexp.weight": [FS, E]})
        if (i + 1) % 4 == 0:
            t.update({b + "attn_q.weight": [E, 2 * H * D], b + "attn_k.weight": [E, HKV * D],
                      b + "attn_v.weight": [E, HKV * D], b + "attn_output.weight": [H * D, E],
                      b + "attn_q_norm.weight": [D], b + "attn_k_norm.weight": [D]})
        else:
            t.update({b + "attn_qkv.weight": [E, conv], b + "attn_gate.weight": [E, vd],
                      b + "ssm_conv1d.weight": [K, conv], b + "ssm_dt.bias": [NV], b + "ssm_a": [NV],
                      b + "ssm_norm.weight": [S], b + "ssm_out.weight": [vd, E]})
            if arch == "qwen3next":
                t[b + "ssm_ba.weight"] = [E, 2 * NV]
            else:
                t.update({b + "ssm_beta.weight": [E, NV], b + "ssm_alpha.weight": [E, NV]})
    return t


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_hybrid_presets(arch):
    """The DeltaNet hybrids' tiny preset: keys, tensor names and shapes, ssm_a negative."""
    r = gguf.GGUFReader(synth(f"synth_{arch}.gguf", "--arch", arch))
    a = arch + "."
    assert field(r, "general.architecture") == arch
    keys = {"full_attention_interval": 4, "rope.dimension_count": 16, "ssm.conv_kernel": 4, "ssm.inner_size": 256,
            "ssm.state_size": 64, "ssm.time_step_rank": 4, "ssm.group_count": 2,
            "expert_shared_feed_forward_length": 256, "block_count": 4, "expert_count": 8}
    assert {k: field(r, a + k) for k in keys} == keys
    if arch == "qwen35moe":
        assert field(r, a + "rope.dimension_sections") == [3, 3, 2, 0]
    have = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert have == expected_hybrid(arch)
    ssm_a = [t for t in r.tensors if t.name.endswith("ssm_a")]
    assert ssm_a and all(np.all(np.asarray(t.data) < 0) for t in ssm_a)
    assert run("info", os.path.join(TMP, f"synth_{arch}.gguf")).returncode == 0
