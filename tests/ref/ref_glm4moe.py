"""NumPy reference forward pass of glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6),
written from the Hugging Face Glm4Moe model definition (modeling_glm4_moe:
Glm4MoeAttention, Glm4MoeTopkRouter, Glm4MoeMoE) and llama.cpp's GGUF names
and keys, not from Strata's C code. float64 throughout; the same options as
ref_forward.forward (act_quant, kv, route, trace, mutate).

Per layer:
  h = RMSNorm(x) * attn_norm
  q, k, v = h W^T + b                        (attention_bias: GLM-4.5 has q/k/v biases)
  q, k = per-head RMSNorm when the file has q/k norms (use_qk_norm, GLM-4.5 355B)
  rotary on the first n_rot = rope.dimension_count values of each head
        (partial_rotary_factor 0.5), rotate-half pairs (i, i + n_rot/2),
        theta_i = pos * base^(-2i / n_rot); the other values pass unrotated
  attention: GQA, causal, softmax(q.k / sqrt(head_dim)); x += o W_o^T
  h = RMSNorm(x) * post_attention_norm
  layers il < leading_dense_block_count: f = down(silu(gate h) * up h)
  the others:
    s = sigmoid(h W_router^T)                (scores)
    chosen = top-k of s + e_score_correction_bias  (GGUF exp_probs_b; choice only)
    w = s[chosen] / sum(s[chosen]) (norm_topk_prob) * routed_scaling_factor
    f = sum_e w_e expert_e(h) + shared(h)    (shared: n_shared * n_ff_exp wide, no gate)
  x += f
logits = RMSNorm(x) * output_norm @ output^T. block_count counts the NextN
(MTP) layers after the decoder's (nextn_predict_layers): they are not run.
`route` holds the engine's router logits of the MoE layers only (in order),
and `trace` receives the reference's the same way.
"""
import numpy as np

from ref_forward import kv_round, quant_act, rmsnorm, silu

MUTATIONS = ("softmax_gate", "no_exp_bias", "bias_in_weights", "no_expert_scale", "full_rope", "no_shexp",
             "no_bias", "dense_as_moe")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def partial_rope(x, pos, base, n_rot):
    """Rotate-half rotary of x[..., :n_rot] (n_tok, heads, d); the rest unchanged."""
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.copy()
    a, b = x[..., :half], x[..., half:n_rot]
    y[..., :half] = a * c - b * s
    y[..., half:n_rot] = a * s + b * c
    return y


def layer(m, il, x, pos, act_quant=False, kv=None, mutate=None, route=None, trace=None):
    """Layer il (blk.{il}.*, also the MTP layer) on rows x at positions pos, attention causal over these
    rows: x + attention, then + FFN. mutate "no_attention" leaves the attention out (ref_mtp's check)."""
    g = lambda k, d=None: m.meta.get(f"glm4moe.{k}", d)  # noqa: E731
    n_dense = int(g("leading_dense_block_count", 0))
    n_rot = m.head_dim if mutate == "full_rope" else int(g("rope.dimension_count", m.head_dim))
    scale = float(g("expert_weights_scale", 0.0)) or 1.0
    renorm = bool(g("expert_weights_norm", False))
    n = len(x)
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim

    def lin(x, name):
        w = m.W(name)
        return (quant_act(x, w.type) if act_quant else x) @ w.w.T

    def norm(x, name):
        return rmsnorm(x, m.vec(name), m.eps)

    def ffn(h, p, suffix=""):
        return lin(silu(lin(h, p + f"ffn_gate{suffix}.weight")) * lin(h, p + f"ffn_up{suffix}.weight"),
                   p + f"ffn_down{suffix}.weight")

    p = f"blk.{il}."
    if mutate != "no_attention":
        h = norm(x, p + "attn_norm.weight")
        q, k, v = lin(h, p + "attn_q.weight"), lin(h, p + "attn_k.weight"), lin(h, p + "attn_v.weight")
        if m.has(p + "attn_q.bias") and mutate != "no_bias":
            q, k, v = q + m.vec(p + "attn_q.bias"), k + m.vec(p + "attn_k.bias"), v + m.vec(p + "attn_v.bias")
        q, k, v = q.reshape(n, H, D), k.reshape(n, HKV, D), v.reshape(n, HKV, D)
        if m.has(p + "attn_q_norm.weight"):
            q, k = norm(q, p + "attn_q_norm.weight"), norm(k, p + "attn_k_norm.weight")
        q, k = partial_rope(q, pos, m.rope_base, n_rot), partial_rope(k, pos, m.rope_base, n_rot)
        if kv:
            k, v = kv_round(k, kv), kv_round(v, kv)
        mask = pos[:, None] >= pos[None, :]
        att = np.empty((n, H, D))
        for hh in range(H):
            kh = hh // (H // HKV)
            s = np.where(mask, (q[:, hh, :] @ k[:, kh, :].T) / np.sqrt(D), -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh, :]
        x = x + lin(att.reshape(n, H * D), p + "attn_output.weight")

    h = norm(x, p + "post_attention_norm.weight")
    if il < n_dense:
        f = ffn(h, p)
    else:
        mi = il - n_dense  # index among the MoE layers
        f = moe(m, h, p, act_quant, renorm, scale, mutate, None if route is None else route[mi], trace, mi)
        if mutate != "no_shexp":
            f = f + ffn(h, p, "_shexp")
    return x + f


def forward(m, tokens, act_quant=False, kv=None, mutate=None, route=None, trace=None, hidden=False):
    """Logits (n_tok, n_vocab); with hidden, the final hidden states (after the output norm; before it
    with hidden "pre")."""
    tokens = np.asarray(tokens)
    pos = np.arange(len(tokens), dtype=np.float64)
    x = m.W("token_embd.weight").w[tokens].copy()
    for il in range(m.n_layer):
        x = layer(m, il, x, pos, act_quant, kv, mutate, route, trace)
    if hidden == "pre":
        return x
    x = rmsnorm(x, m.vec("output_norm.weight"), m.eps)
    if hidden:
        return x
    out = m.W("output.weight") if m.has("output.weight") else m.W("token_embd.weight")
    return (quant_act(x, out.type) if act_quant else x) @ out.w.T


def moe(m, h, p, act_quant, renorm, scale, mutate, choose, trace, mi):
    """Glm4MoeTopkRouter + routed experts. choose: router logits whose choice
    (by the same rule) is taken instead of the reference's own."""
    logits = h @ m.W(p + "ffn_gate_inp.weight").w.T
    if trace is not None:
        trace[mi] = logits
    bias = m.vec(p + "exp_probs_b.bias")
    if mutate == "softmax_gate":
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        score = e / e.sum(axis=1, keepdims=True)
    else:
        score = sigmoid(logits)
    pick = sigmoid(choose) if choose is not None else score
    sel_score = pick if mutate == "no_exp_bias" else pick + bias
    g, u, dn = m.W(p + "ffn_gate_exps.weight"), m.W(p + "ffn_up_exps.weight"), m.W(p + "ffn_down_exps.weight")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-sel_score[t], kind="stable")[: m.n_expert_used]
        wts = score[t, top] + (bias[top] if mutate == "bias_in_weights" else 0.0)
        if renorm:
            wts = wts / wts.sum()
        if mutate != "no_expert_scale":
            wts = wts * scale
        for e, we in zip(top, wts):
            hg = quant_act(h[t], g.type) if act_quant else h[t]
            hu = quant_act(h[t], u.type) if act_quant else h[t]
            a = silu(g.w[e] @ hg) * (u.w[e] @ hu)
            if act_quant:
                a = quant_act(a, dn.type)
            out[t] += we * (dn.w[e] @ a)
    return out
