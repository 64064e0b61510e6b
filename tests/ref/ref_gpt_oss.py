"""NumPy reference forward pass of gpt-oss (gpt-oss-20b, gpt-oss-120b),
written from the model card and the Hugging Face GptOss model definition
(modeling_gpt_oss: GptOssAttention with its sinks, GptOssTopKRouter,
GptOssExperts; modeling_rope_utils' YaRN) and llama.cpp's GGUF names and keys,
not from Strata's C code. float64 throughout; the same options as
ref_forward.forward (act_quant, kv, route, trace, mutate).

Per layer (layer_types: "sliding_attention" for even layers, "full_attention" for odd):
  h = RMSNorm(x) * attn_norm
  q, k, v = h W^T + b
  rotary (rotate-half pairs (i, i + d/2)) with YaRN's inverse frequencies:
      inv_i = interp_i (1 - e_i) + extrap_i e_i, extrap_i = base^(-2i/d), interp_i = extrap_i / factor,
      e_i = 1 - clamp((i - low) / (high - low), 0, 1),
      low, high = d ln(orig / (beta 2 pi)) / (2 ln base) for beta = beta_fast (32), beta_slow (1),
      floored / ceiled only when truncate (OpenAI's reference RotaryEmbedding never rounds;
      transformers rounds unless the config's rope_scaling says truncate: false);
      cos and sin times attention_factor = 0.1 ln(factor) + 1
  attention: GQA, causal, sliding layers see keys with q_idx - kv_idx < sliding_window;
      logits = q.k / sqrt(d), one more logit per head (the sink, attn_sinks) joins the
      softmax and is dropped after it; x += o W_o^T + b_o
  h = RMSNorm(x) * post_attention_norm
  router: l = h W_r^T + b_r; top-k of l; w = softmax of the chosen l
  expert e: g = h G_e^T + bg_e, u = h U_e^T + bu_e; g = min(g, 7); u = clamp(u, -7, 7);
      a = g sigmoid(1.702 g) (u + 1); y = a D_e^T + bd_e
  x += sum_e w_e y_e
logits = RMSNorm(x) * output_norm @ output^T.
`route` holds the engine's router logits (bias included) per layer;
`trace` receives the reference's the same way.
"""
import math

import numpy as np

from ref_forward import kv_round, quant_act, rmsnorm

MUTATIONS = ("no_sinks", "no_clamp", "window_off_by_one", "no_yarn", "yarn_truncate", "no_yarn_mscale",
             "softmax_all", "no_expert_bias", "swa_odd_layers", "no_o_bias")

ALPHA, LIMIT = 1.702, 7.0


def yarn_inv_freq(d, base, factor, orig, beta_fast=32.0, beta_slow=1.0, truncate=False):
    """modeling_rope_utils._compute_yarn_parameters: (inv_freq, attention_factor)."""
    def corr_dim(rot):
        return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    extrap = 1.0 / base ** (np.arange(0, d, 2) / d)
    interp = extrap / factor
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    e = 1 - ramp
    return interp * (1 - e) + extrap * e, 0.1 * math.log(factor) + 1.0


def rope_half(x, pos, inv, scale):
    half = x.shape[-1] // 2
    ang = pos[:, None] * inv[None, :]
    c, s = (np.cos(ang) * scale)[:, None, :], (np.sin(ang) * scale)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def forward(m, tokens, act_quant=False, kv=None, mutate=None, route=None, trace=None):
    g = lambda k, d=None: m.meta.get(f"gpt-oss.{k}", d)  # noqa: E731
    window = int(g("attention.sliding_window"))
    tokens = np.asarray(tokens)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim
    if g("rope.scaling.type") == "yarn" and mutate != "no_yarn":
        inv, mscale = yarn_inv_freq(D, m.rope_base, float(g("rope.scaling.factor")),
                                    int(g("rope.scaling.original_context_length")),
                                    truncate=mutate == "yarn_truncate")
    else:
        inv, mscale = 1.0 / m.rope_base ** (np.arange(0, D, 2) / D), 1.0
    if mutate == "no_yarn_mscale":
        mscale = 1.0

    def lin(x, name, bias=None):
        w = m.W(name)
        y = (quant_act(x, w.type) if act_quant else x) @ w.w.T
        return y if bias is None else y + m.vec(bias)

    def norm(x, name):
        return rmsnorm(x, m.vec(name), m.eps)

    x = m.W("token_embd.weight").w[tokens].copy()
    for il in range(m.n_layer):
        p = f"blk.{il}."
        h = norm(x, p + "attn_norm.weight")
        q = lin(h, p + "attn_q.weight", p + "attn_q.bias").reshape(n, H, D)
        k = lin(h, p + "attn_k.weight", p + "attn_k.bias").reshape(n, HKV, D)
        v = lin(h, p + "attn_v.weight", p + "attn_v.bias").reshape(n, HKV, D)
        q, k = rope_half(q, pos, inv, mscale), rope_half(k, pos, inv, mscale)
        if kv:
            k, v = kv_round(k, kv), kv_round(v, kv)
        sliding = (il % 2 == 1) if mutate == "swa_odd_layers" else (il % 2 == 0)
        mask = pos[:, None] >= pos[None, :]
        if sliding:
            w_eff = window + 1 if mutate == "window_off_by_one" else window
            mask &= (pos[:, None] - pos[None, :]) < w_eff
        sinks = m.vec(p + "attn_sinks.weight")
        att = np.empty((n, H, D))
        for hh in range(H):
            kh = hh // (H // HKV)
            s = np.where(mask, (q[:, hh, :] @ k[:, kh, :].T) / np.sqrt(D), -np.inf)
            if mutate != "no_sinks":  # the sink: one more column in the softmax, dropped after it
                s = np.concatenate([s, np.full((n, 1), sinks[hh])], axis=1)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            pr = s / s.sum(axis=1, keepdims=True)
            att[:, hh, :] = pr[:, :n] @ v[:, kh, :]
        o_bias = None if mutate == "no_o_bias" else p + "attn_output.bias"
        x = x + lin(att.reshape(n, H * D), p + "attn_output.weight", o_bias)
        h = norm(x, p + "post_attention_norm.weight")
        x = x + moe(m, h, p, act_quant, mutate, None if route is None else route[il], trace, il)
    return lin(norm(x, "output_norm.weight"), "output.weight")


def moe(m, h, p, act_quant, mutate, choose, trace, il):
    """GptOssTopKRouter + GptOssExperts. choose: router logits whose top-k is
    taken instead of the reference's own (weights stay the reference's)."""
    logits = h @ m.W(p + "ffn_gate_inp.weight").w.T + m.vec(p + "ffn_gate_inp.bias")
    if trace is not None:
        trace[il] = logits
    g, u, dn = m.W(p + "ffn_gate_exps.weight"), m.W(p + "ffn_up_exps.weight"), m.W(p + "ffn_down_exps.weight")
    bg, bu, bd = (m.W(p + f"ffn_{s}_exps.bias").w for s in ("gate", "up", "down"))  # [expert][width]
    if mutate == "no_expert_bias":
        bg, bu, bd = np.zeros_like(bg), np.zeros_like(bu), np.zeros_like(bd)
    pick = choose if choose is not None else logits
    out = np.zeros_like(h)
    k = m.n_expert_used
    for t in range(h.shape[0]):
        top = np.argsort(-pick[t], kind="stable")[:k]
        if mutate == "softmax_all":  # softmax over every expert, the chosen ones' shares unrenormalised
            e = np.exp(logits[t] - logits[t].max())
            wts = (e / e.sum())[top]
        else:
            e = np.exp(logits[t, top] - logits[t, top].max())
            wts = e / e.sum()
        for ex, we in zip(top, wts):
            hg = quant_act(h[t], g.type) if act_quant else h[t]
            hu = quant_act(h[t], u.type) if act_quant else h[t]
            gv, uv = g.w[ex] @ hg + bg[ex], u.w[ex] @ hu + bu[ex]
            if mutate != "no_clamp":
                gv, uv = np.minimum(gv, LIMIT), np.clip(uv, -LIMIT, LIMIT)
            a = gv / (1.0 + np.exp(-ALPHA * gv)) * (uv + 1.0)
            if act_quant:
                a = quant_act(a, dn.type)
            out[t] += we * (dn.w[ex] @ a + bd[ex])
    return out
