"""A plain NumPy reference forward pass for the decoder families Strata runs
(llama, qwen2, qwen3, qwen3moe, gemma3; the hybrid qwen35moe and qwen3next
are in ref_hybrid.py, glm4moe in ref_glm4moe.py, gpt-oss in ref_gpt_oss.py), reading a GGUF file through the gguf
package (GGUFReader + gguf.quants.dequantize). It is written from the model
definitions (the Hugging Face modeling code and llama.cpp's GGUF conventions),
not from Strata's C code, and computes in float64.

Semantics, per layer (HF modeling code):
  h = RMSNorm(x) * w;  q, k, v = h W^T (+ bias, qwen2)
  q, k: per-head RMSNorm (qwen3, qwen3moe, gemma3), then RoPE at the token's
        position: theta_i = pos * base^(-2i/d) (/ rope_freqs[i] when the file
        has rope_freqs.weight, Llama 3.1+; global layers only), NeoX rotate-half pairs (i, i+d/2)
        for qwen2/qwen3/qwen3moe/gemma3, interleaved pairs (2i, 2i+1) for llama
        (llama.cpp's converter permutes llama's Q/K rows for that layout)
  attention: GQA (query head h reads kv head h // (n_head/n_head_kv)), causal,
        softmax(q.k / sqrt(head_dim)) (Gemma 3 27B, 62 layers: / sqrt(n_embd / n_head));
        gemma3 sliding-window layers (il % 6 != 5)
        see only positions p' with p - p' < window and use RoPE base 10000,
        global layers use rope.freq_base and linear rope scaling if present
  x += [post_attention_norm](o W_o^T)
  h = RMSNorm(x) * w;  f = down(act(gate h) * up h), act = SiLU, or GELU-tanh
        for gemma3; MoE: p = softmax(router h), top-k, renormalised, sum of
        p_e * expert_e(h)
  x += [post_ffw_norm](f)
  logits = RMSNorm(x) * w_out_norm @ output^T (token_embd when tied)
Gemma3 scales the embedding by sqrt(n_embd). Norm weights are used as stored
(llama.cpp's Gemma converter already added the 1).

Optional emulation (for a second, tighter comparison): `act_quant` rounds each
matrix product's input as a llama.cpp-style CPU engine does (Q8_0 blocks for
legacy-quant weights, Q8_K for K/i-quants, none for F32/F16), and `kv` rounds
K and V as stored in the cache (f16, or int8 with one absmax/127 scale per
head and position). `route` (per layer, [n_tok][n_expert] router logits
from the engine under test) makes the MoE blocks pick the engine's experts,
weighted by the reference's own probabilities, so that a choice flipped at a
near-tie by rounding is not counted as a forward-pass error; `trace` (a dict)
receives the reference's own router logits per layer. `mutate` names a deliberate error (see MUTATIONS), used by
the tests to prove that their tolerances catch real mistakes.
"""
import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize

ACT_Q8_0 = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL, QT.MXFP4}
ACT_NONE = {QT.F32, QT.F16, QT.BF16}

MUTATIONS = ("rope_style", "skip_qk_norm", "skip_post_norm", "no_embd_scale", "no_window", "no_topk_renorm",
             "no_bias", "gelu_as_silu", "swa_rope_base", "rope_scaling_off", "skip_attn_norm", "kv_head_map",
             "no_rope_freqs", "qk_scalar_head_dim")

SWA_PATTERN = 6  # Gemma 3: five sliding-window layers, then one global


class Weight:
    """A matrix (or stack) dequantized once to float64, with its storage type."""

    def __init__(self, t):
        self.type = QT(t.tensor_type)
        self.w = np.asarray(dequantize(t.data, self.type), dtype=np.float64)


def _round_blocks(x, blck, fp16_scale):
    """Symmetric 8-bit rounding of x's last axis in blocks of blck values:
    d = absmax/127, q = round(x/d); returns q*d (d rounded to f16 if asked)."""
    shp = x.shape
    xb = x.reshape(-1, shp[-1] // blck, blck)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = (amax / 127.0).astype(np.float32).astype(np.float64)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(xb * inv), -127, 127)
    if fp16_scale:
        d = d.astype(np.float16).astype(np.float64)
    return (q * d).reshape(shp)


def quant_act(x, wtype):
    if wtype in ACT_NONE:
        return x
    if wtype in ACT_Q8_0:
        return _round_blocks(x, 32, True)
    return _round_blocks(x, 256, False)  # Q8_K: f32 scale per 256 values


class RefModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        self.arch = self.meta["general.architecture"]
        g = lambda k, d=None: self.meta.get(f"{self.arch}.{k}", d)  # noqa: E731
        self.n_layer = int(g("block_count")) - int(g("nextn_predict_layers", 0))  # MTP layers are not run
        self.n_embd = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_head_kv = int(g("attention.head_count_kv", self.n_head))
        self.head_dim = int(g("attention.key_length", self.n_embd // self.n_head))
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(g("rope.freq_base", 10000.0))
        self.rope_pos_scale = 1.0
        if g("rope.scaling.type") == "linear":
            self.rope_pos_scale = 1.0 / float(g("rope.scaling.factor", 1.0))
        self.n_expert = int(g("expert_count", 0))
        self.n_expert_used = int(g("expert_used_count", 0))
        self.window = int(g("attention.sliding_window", 0)) if self.arch == "gemma3" else 0
        # Gemma 3 27B (62 layers): q.k scaled by query_pre_attn_scalar = n_embd / n_head, not head_dim
        self.qk_scalar = self.n_embd / self.n_head if (self.arch == "gemma3" and self.n_layer == 62) else self.head_dim
        self.t = {t.name: t for t in r.tensors}
        self._cache = {}

    def has(self, name):
        return name in self.t

    def W(self, name):
        if name not in self._cache:
            self._cache[name] = Weight(self.t[name])
        return self._cache[name]

    def vec(self, name):
        return self.W(name).w.reshape(-1)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base, neox, pos_scale=1.0, freq_div=None):
    """x: (n_tok, n_heads, d), rotated in place of a copy at positions pos;
    freq_div: per-pair divisors of the frequencies (Llama 3.1 rope_freqs)."""
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-2.0 * np.arange(half) / d)
    if freq_div is not None:
        inv = inv / freq_div
    ang = (pos * pos_scale)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:]
        y[..., :half] = a * c - b * s
        y[..., half:] = a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = a * s + b * c
    return y


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def kv_round(x, kv):
    """x: (n_tok, n_head_kv, d) as the cache stores it."""
    if kv == "f16":
        return x.astype(np.float16).astype(np.float64)
    if kv == "int8":
        amax = np.abs(x).max(axis=-1, keepdims=True)
        d = (amax / 127.0).astype(np.float32).astype(np.float64)
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        return np.rint(x * inv) * d
    return x


def forward(m, tokens, act_quant=False, kv=None, mutate=None, route=None, trace=None):
    """Logits (n_tok, n_vocab) in float64 for tokens at positions 0..n_tok-1."""
    arch = m.arch
    if arch in ("qwen35moe", "qwen3next", "qwen35"):  # the hybrids: their own file, the same conventions
        import ref_hybrid
        return ref_hybrid.forward(m, tokens, act_quant=act_quant, kv=kv, mutate=mutate, route=route, trace=trace)
    if arch == "gpt-oss":  # sinks, YaRN, biased experts, the clamped SwiGLU: ref_gpt_oss.py
        import ref_gpt_oss
        return ref_gpt_oss.forward(m, tokens, act_quant=act_quant, kv=kv, mutate=mutate, route=route, trace=trace)
    if arch == "glm4moe":  # sigmoid routing, dense leading layers, partial rotary: ref_glm4moe.py
        import ref_glm4moe
        return ref_glm4moe.forward(m, tokens, act_quant=act_quant, kv=kv, mutate=mutate, route=route, trace=trace)
    tokens = np.asarray(tokens)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim
    neox = arch != "llama"
    if mutate == "rope_style":
        neox = not neox
    gemma = arch == "gemma3"

    def lin(x, name):
        w = m.W(name)
        xin = quant_act(x, w.type) if act_quant else x
        return xin @ w.w.T

    def norm(x, name):
        return rmsnorm(x, m.vec(name), m.eps)

    x = m.W("token_embd.weight").w[tokens].copy()
    if gemma and mutate != "no_embd_scale":
        x *= np.sqrt(m.n_embd)
    for il in range(m.n_layer):
        p = f"blk.{il}."
        h = x if mutate == "skip_attn_norm" else norm(x, p + "attn_norm.weight")
        q, k, v = lin(h, p + "attn_q.weight"), lin(h, p + "attn_k.weight"), lin(h, p + "attn_v.weight")
        if m.has(p + "attn_q.bias") and mutate != "no_bias":
            q, k, v = q + m.vec(p + "attn_q.bias"), k + m.vec(p + "attn_k.bias"), v + m.vec(p + "attn_v.bias")
        q, k, v = q.reshape(n, H, D), k.reshape(n, HKV, D), v.reshape(n, HKV, D)
        if m.has(p + "attn_q_norm.weight") and mutate != "skip_qk_norm":
            q, k = norm(q, p + "attn_q_norm.weight"), norm(k, p + "attn_k_norm.weight")
        local = gemma and il % SWA_PATTERN != SWA_PATTERN - 1
        if local:
            base, pscale = (m.rope_base if mutate == "swa_rope_base" else 10000.0), 1.0
        else:
            base, pscale = m.rope_base, (1.0 if mutate == "rope_scaling_off" else m.rope_pos_scale)
        div = None
        if not local and m.has("rope_freqs.weight") and mutate != "no_rope_freqs":
            div = m.vec("rope_freqs.weight").astype(np.float64)
        q, k = rope(q, pos, base, neox, pscale, div), rope(k, pos, base, neox, pscale, div)
        if kv:
            k, v = kv_round(k, kv), kv_round(v, kv)
        window = m.window if (local and mutate != "no_window") else 0
        dp = pos[:, None] - pos[None, :]  # query minus key position
        mask = dp >= 0
        if window:
            mask &= dp < window
        att = np.empty((n, H, D))
        group = H // HKV
        for hh in range(H):
            kh = (hh % HKV) if mutate == "kv_head_map" else hh // group
            s = (q[:, hh, :] @ k[:, kh, :].T) / np.sqrt(D if mutate == "qk_scalar_head_dim" else m.qk_scalar)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh, :]
        o = lin(att.reshape(n, H * D), p + "attn_output.weight")
        if m.has(p + "post_attention_norm.weight") and mutate != "skip_post_norm":
            o = norm(o, p + "post_attention_norm.weight")
        x = x + o

        h = norm(x, p + "ffn_norm.weight")
        act = gelu_tanh if (gemma and mutate != "gelu_as_silu") else silu
        if m.n_expert:
            f = moe(m, h, p, act, act_quant, renorm=mutate != "no_topk_renorm",
                    choose=None if route is None else route[il], trace=trace, il=il)
        else:
            f = lin(act(lin(h, p + "ffn_gate.weight")) * lin(h, p + "ffn_up.weight"), p + "ffn_down.weight")
        if m.has(p + "post_ffw_norm.weight") and mutate != "skip_post_norm":
            f = norm(f, p + "post_ffw_norm.weight")
        x = x + f
    out = "output.weight" if m.has("output.weight") else "token_embd.weight"
    return lin(norm(x, "output_norm.weight"), out)


def moe(m, h, p, act, act_quant, renorm=True, choose=None, trace=None, il=0):
    """Qwen3-MoE sparse block: softmax over all experts, top-k, renormalised.
    choose: logits whose top-k picks the experts instead of the router's."""
    router = h @ m.W(p + "ffn_gate_inp.weight").w.T
    if trace is not None:
        trace[il] = router
    pr = np.exp(router - router.max(axis=1, keepdims=True))
    pr /= pr.sum(axis=1, keepdims=True)
    g, u, dn = m.W(p + "ffn_gate_exps.weight"), m.W(p + "ffn_up_exps.weight"), m.W(p + "ffn_down_exps.weight")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-(pr[t] if choose is None else choose[t]), kind="stable")[: m.n_expert_used]
        wts = pr[t, top] / (pr[t, top].sum() if renorm else 1.0)
        for e, we in zip(top, wts):
            hg = quant_act(h[t], g.type) if act_quant else h[t]
            hu = quant_act(h[t], u.type) if act_quant else h[t]
            a = act(g.w[e] @ hg) * (u.w[e] @ hu)
            if act_quant:
                a = quant_act(a, dn.type)
            out[t] += we * (dn.w[e] @ a)
    return out
