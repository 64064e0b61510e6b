"""NumPy reference forward pass of deepseek2 (DeepSeek-V3/R1; V2 with softmax
routing), written from the DeepSeek-V3 paper (section 2.1) and the Hugging
Face modeling_deepseek.py (DeepseekV3Attention, DeepseekV3YarnRotaryEmbedding,
MoEGate, DeepseekV3MoE), with llama.cpp's GGUF names and keys; not from
Strata's C code. float64 throughout.

Attention is the naive (decompressed) form, on purpose: Strata computes the
absorbed form over a latent cache, and this is the independent check of it.
  c_q = RMSNorm(h W_qa^T) * q_a_norm;  q = c_q W_qb^T   (or q = h W_q^T without q_lora)
  q per head = [q_nope (qk_nope), q_pe (qk_rope)]
  [c_kv, k_pe] = h W_kva^T;  c_kv = RMSNorm(c_kv) * kv_a_norm
  kv_b_proj, rebuilt from GGUF's split attn_k_b / attn_v_b:
     k_nope[head] = W_kb[head] c_kv,  v[head] = W_vb[head] c_kv
  q_pe, k_pe: HF's rotary (apply_rotary_pos_emb: de-interleave, then
     rotate-half) with DeepSeek's YaRN frequencies; k_pe is one head shared
  key[head] = [k_nope[head], k_pe]; softmax(q.key * scale) v, causal
  scale = 1/sqrt(qk_nope + qk_rope) * mscale^2, mscale = 0.1 mscale_all_dim ln(factor) + 1
  x += o W_o^T
FFN (after RMSNorm * ffn_norm): the first leading_dense_block_count layers
dense SiLU-gated; the others MoEGate:
  s = sigmoid(h W_r^T) (softmax for expert_gating_func 1)
  c = s + e_score_correction_bias (GGUF exp_probs_b)
  group score = sum of the top-2 c in each of n_group groups; keep topk_group
  groups; top-k experts of c among them (others masked with 0.0, as HF does)
  w = s[chosen], / sum (norm_topk_prob), * routed_scaling_factor
  f = sum w_e expert_e(h) + shared(h)
`kv` rounds what the MLA cache holds (the rotated k_pe and the normalised
c_kv, one row per position: f16, or int8 with one scale per row) as the
cache stores it. `mutate` names a deliberate error (MUTATIONS).
"""
import math

import numpy as np

from ref_forward import kv_round, rmsnorm, silu

MUTATIONS = ("group_max", "no_groups", "no_mscale", "no_yarn", "neox_rope", "softmax_gate", "no_exp_bias",
             "no_expert_scale", "no_shexp")
OTHER_MUTATIONS = ("no_softmax_gate",)  # for softmax-routed files (V2): sigmoid instead


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def yarn_inv_freq(dim, base, factor, orig_ctx, beta_fast=32.0, beta_slow=1.0):
    """DeepseekV3YarnRotaryEmbedding's inv_freq (yarn_find_correction_range, yarn_linear_ramp_mask)."""
    freq_extra = 1.0 / (base ** (np.arange(0, dim, 2) / dim))
    freq_inter = 1.0 / (factor * base ** (np.arange(0, dim, 2) / dim))

    def corr(n_rot):
        return (dim * math.log(orig_ctx / (n_rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    return freq_inter * (1 - mask) + freq_extra * mask


def rotary_hf(x, pos, inv_freq, neox=False):
    """HF apply_rotary_pos_emb of modeling_deepseek: x (..., d) in the checkpoint's
    interleaved order is first de-interleaved (evens, then odds), then rotated
    half against half. neox=True skips the de-interleave (a mutation)."""
    d = x.shape[-1]
    if not neox:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    ang = pos[:, None] * inv_freq[None, :]
    emb = np.concatenate([ang, ang], axis=-1)  # (n_tok, d)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (d,)
    cos, sin = np.cos(emb).reshape(shape), np.sin(emb).reshape(shape)
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rot * sin


def params(m, mutate=None):
    """The file's hyper-parameters and rotary tables, as a dict for layer()."""
    g = lambda k, d=None: m.meta.get(f"deepseek2.{k}", d)  # noqa: E731
    P = dict(n_dense=int(g("leading_dense_block_count", 0)), q_lora=int(g("attention.q_lora_rank", 0)),
             kv_lora=int(g("attention.kv_lora_rank")), qk_head=int(g("attention.key_length_mla")),
             v_head=int(g("attention.value_length_mla")), rope_dim=int(g("rope.dimension_count")),
             gating=int(g("expert_gating_func", 1)), renorm=bool(g("expert_weights_norm", False)),
             rscale=float(g("expert_weights_scale", 0.0)) or 1.0, n_group=int(g("expert_group_count", 1)))
    P["topk_group"] = int(g("expert_group_used_count", P["n_group"]))
    P["nope"] = P["qk_head"] - P["rope_dim"]
    factor = float(g("rope.scaling.factor", 1.0)) if g("rope.scaling.type") == "yarn" else 1.0
    mscale_all = float(g("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
    orig_ctx = int(g("rope.scaling.original_context_length", 4096))
    rope_dim = P["rope_dim"]
    if factor > 1.0 and mutate != "no_yarn":
        P["inv_freq"] = yarn_inv_freq(rope_dim, m.rope_base, factor, orig_ctx)
    else:
        P["inv_freq"] = 1.0 / (m.rope_base ** (np.arange(0, rope_dim, 2) / rope_dim))
    P["softmax_scale"] = P["qk_head"] ** -0.5
    if factor > 1.0 and mutate != "no_mscale":
        ms = 0.1 * mscale_all * math.log(factor) + 1.0
        P["softmax_scale"] *= ms * ms
    return P


def layer(m, P, il, x, pos, kv=None, mutate=None):
    """Layer il (blk.{il}.*, also the MTP layer) on rows x at positions pos, attention causal over these
    rows: x + attention, then + FFN. mutate "no_attention" leaves the attention out (ref_mtp's check)."""
    p = f"blk.{il}."
    n, H = len(x), m.n_head
    nope, rope_dim, kv_lora = P["nope"], P["rope_dim"], P["kv_lora"]
    if mutate != "no_attention":
        h = rmsnorm(x, m.vec(p + "attn_norm.weight"), m.eps)
        if P["q_lora"]:
            cq = rmsnorm(h @ m.W(p + "attn_q_a.weight").w.T, m.vec(p + "attn_q_a_norm.weight"), m.eps)
            q = cq @ m.W(p + "attn_q_b.weight").w.T
        else:
            q = h @ m.W(p + "attn_q.weight").w.T
        q = q.reshape(n, H, P["qk_head"])
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        ckv = h @ m.W(p + "attn_kv_a_mqa.weight").w.T
        c, k_pe = ckv[:, :kv_lora], ckv[:, kv_lora:]
        c = rmsnorm(c, m.vec(p + "attn_kv_a_norm.weight"), m.eps)
        k_pe = rotary_hf(k_pe, pos, P["inv_freq"], neox=mutate == "neox_rope")
        q_pe = rotary_hf(q_pe, pos, P["inv_freq"], neox=mutate == "neox_rope")
        if kv:  # what the latent cache holds, rounded as stored: one row [k_pe, c_kv] (int8: one scale)
            row = kv_round(np.concatenate([k_pe, c], axis=-1)[:, None, :], kv)[:, 0, :]
            k_pe, c = row[:, :rope_dim], row[:, rope_dim:]
        # kv_b_proj per head: GGUF attn_k_b is (head, kv_lora, nope) = W_k^T, attn_v_b (head, v_head, kv_lora)
        wkb = m.W(p + "attn_k_b.weight").w.reshape(H, kv_lora, nope)
        wvb = m.W(p + "attn_v_b.weight").w.reshape(H, P["v_head"], kv_lora)
        k_nope = np.einsum("hcn,tc->thn", wkb, c)
        v = np.einsum("hvc,tc->thv", wvb, c)
        key = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None, :], (n, H, rope_dim))], axis=-1)
        qq = np.concatenate([q_nope, q_pe], axis=-1)
        causal = np.where(pos[:, None] >= pos[None, :], 0.0, -np.inf)
        att = np.einsum("thd,shd->hts", qq, key) * P["softmax_scale"] + causal[None]
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shv->thv", att, v).reshape(n, H * P["v_head"])
        x = x + o @ m.W(p + "attn_output.weight").w.T

    h = rmsnorm(x, m.vec(p + "ffn_norm.weight"), m.eps)
    if il < P["n_dense"]:
        f = (silu(h @ m.W(p + "ffn_gate.weight").w.T) * (h @ m.W(p + "ffn_up.weight").w.T)) @ \
            m.W(p + "ffn_down.weight").w.T
    else:
        f = moe(m, p, h, P["gating"], P["renorm"], P["rscale"], P["n_group"], P["topk_group"], mutate)
    return x + f


def forward(m, tokens, kv=None, mutate=None, hidden=False):
    """Logits (n_tok, n_vocab); with hidden, the final hidden states (after the output norm; before it
    with hidden "pre")."""
    assert mutate is None or mutate in MUTATIONS + OTHER_MUTATIONS, mutate
    P = params(m, mutate)
    tokens = np.asarray(tokens)
    pos = np.arange(len(tokens), dtype=np.float64)
    x = m.W("token_embd.weight").w[tokens].copy()
    for il in range(m.n_layer):
        x = layer(m, P, il, x, pos, kv, mutate)
    if hidden == "pre":
        return x
    x = rmsnorm(x, m.vec("output_norm.weight"), m.eps)
    if hidden:
        return x
    out = m.W("output.weight").w if m.has("output.weight") else m.W("token_embd.weight").w
    return x @ out.T


def moe(m, p, h, gating, renorm, rscale, n_group, topk_group, mutate):
    logits = h @ m.W(p + "ffn_gate_inp.weight").w.T
    if (gating == 2 and mutate != "softmax_gate") or mutate == "no_softmax_gate":
        s = sigmoid(logits)
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        s = e / e.sum(-1, keepdims=True)
    c = s.copy()
    if m.has(p + "exp_probs_b.bias") and mutate != "no_exp_bias":
        c = c + m.vec(p + "exp_probs_b.bias")[None, :]
    n_tok, n_exp = s.shape
    k = m.n_expert_used
    if n_group > 1 and mutate != "no_groups":
        cg = c.reshape(n_tok, n_group, n_exp // n_group)
        if mutate == "group_max":
            gs = cg.max(-1)
        else:
            gs = np.sort(cg, axis=-1)[..., -2:].sum(-1)
        keep = np.argsort(-gs, axis=-1, kind="stable")[:, :topk_group]
        mask = np.zeros((n_tok, n_group), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        c = np.where(np.repeat(mask, n_exp // n_group, axis=-1), c, 0.0)
    chosen = np.argsort(-c, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(s, chosen, axis=-1)
    if renorm:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    if mutate != "no_expert_scale":
        w = w * rscale
    gate, up, down = (m.W(p + f"ffn_{t}_exps.weight").w for t in ("gate", "up", "down"))
    f = np.zeros_like(h)
    for t in range(n_tok):
        for j in range(k):
            e = chosen[t, j]
            f[t] += w[t, j] * ((silu(gate[e] @ h[t]) * (up[e] @ h[t])) @ down[e].T)
    if mutate != "no_shexp":
        f += (silu(h @ m.W(p + "ffn_gate_shexp.weight").w.T) * (h @ m.W(p + "ffn_up_shexp.weight").w.T)) @ \
            m.W(p + "ffn_down_shexp.weight").w.T
    return f
