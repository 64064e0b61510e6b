"""NumPy reference of the hybrid Qwen family (llama.cpp architectures
qwen35moe, qwen3next and the dense qwen35: Qwen3.5-MoE, Qwen3-Next, Qwen3.5), float64, written from the
equations of the Gated DeltaNet paper (Yang, Kautz, Hatamizadeh 2024) and the
Qwen3-Next modeling code as llama.cpp's GGUF stores it, not from Strata's C.

Per layer, h = RMSNorm(x) * attn_norm, then either
  gated DeltaNet ((il + 1) % full_attention_interval != 0):
    [q | k | v] = h W_qkv^T;  z = h W_gate^T;  beta, alpha = h W_beta^T, h W_alpha^T
        (qwen3next: one ssm_ba product, per key head its n_v/n_k betas then alphas)
    c = SiLU(causal depthwise conv, width d_conv, of [q | k | v] over time)
    q = l2norm(q) / sqrt(d), k = l2norm(k)      (l2norm(x) = x / sqrt(sum x^2 + eps))
    beta = sigmoid(beta);  g = softplus(alpha + dt_bias) * ssm_a   (ssm_a = -exp(A_log): log decay)
    per value head j (key/query head j % n_k for qwen35moe, j // (n_v/n_k) for
    qwen3next: llama.cpp tiles the key heads for one and repeat-interleaves them
    for the other):
        S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T,   o_t = S_t q_t
    o = RMSNorm(o per head) * ssm_norm * SiLU(z);  a = o W_out^T
  or gated attention:
    [q_h | gate_h] per head = h W_q^T (2 * head_dim rows per head); k, v = h W_k^T, h W_v^T
    q, k: per-head RMSNorm; NeoX RoPE of the first n_rot values of each head,
        theta_i = pos * base^(-2i / n_rot) (qwen35moe's interleaved M-RoPE sections
        all carry the text position, so they reduce to this); causal GQA attention
    a = (attention * sigmoid(gate)) W_o^T
then x += a;  h = RMSNorm(x) * post_attention_norm;
  f = MoE(h) (softmax, top-k, renormalised) + sigmoid(h . w_shexp_gate) * down(SiLU(gate h) * up h)
  x += f
logits = RMSNorm(x) * output_norm @ output^T.

The recurrence is computed in the chunked (WY / UT-transform) form of the
paper (`gdn_chunked`, chunks of 8 positions) by default, and also in the
plain per-token form (`gdn_recurrent`); the test checks that the two agree,
so the reference does not rest on one derivation.
"""
import numpy as np

import ref_forward as rf

HYBRID = ("qwen35moe", "qwen3next", "qwen35")
MUTATIONS = ("gdn_head_map", "no_attn_gate", "full_rope", "no_shexp_gate", "no_decay", "no_conv_history")


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def l2norm(x, eps):
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


def gdn_recurrent(q, k, v, g, beta):
    """One head: q, k (n, d), v (n, dv), g (n,) log decay, beta (n,). S is (dv, d)."""
    n, d = k.shape
    S = np.zeros((v.shape[1], d))
    o = np.empty_like(v)
    for t in range(n):
        S = np.exp(g[t]) * S
        S = S + beta[t] * np.outer(v[t] - S @ k[t], k[t])
        o[t] = S @ q[t]
    return o


def gdn_chunked(q, k, v, g, beta, C=8):
    """The same in chunks of C: within a chunk the delta rule's updates are a
    lower-triangular system, solved once (the UT transform: T = (I + A)^-1,
    A[i, j] = beta_i exp(G_i - G_j) k_i.k_j for j < i); across chunks the state
    carries the rest. Hs is the state transposed (d, dv), as in the paper."""
    n, d = k.shape
    dv = v.shape[1]
    pad = (-n) % C
    if pad:  # padded positions: k = v = 0, beta = 0, no decay: they change nothing
        z = lambda a, w: np.concatenate([a, np.zeros((pad, w))])  # noqa: E731
        q, k, v = z(q, d), z(k, d), z(v, dv)
        g, beta = np.concatenate([g, np.zeros(pad)]), np.concatenate([beta, np.zeros(pad)])
    Hs = np.zeros((d, dv))
    out = np.empty_like(v)
    low = np.tril(np.ones((C, C)), -1).astype(bool)
    for c0 in range(0, len(g), C):
        sl = slice(c0, c0 + C)
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]
        G = np.cumsum(g[sl])  # log of the decay from the chunk start through position i
        D = np.exp(G[:, None] - G[None, :])  # decay from after j to i (used for j <= i)
        A = np.where(low, bc[:, None] * (kc @ kc.T) * D, 0.0)
        T = np.linalg.inv(np.eye(C) + A)
        # pseudo-values: u_i = beta_i (v_i - exp(G_i) Hs^T k_i - sum_{j<i} D_ij k_i.k_j u_j)
        U = T @ (bc[:, None] * (vc - np.exp(G)[:, None] * (kc @ Hs)))
        att = np.where(np.tril(np.ones((C, C))).astype(bool), (qc @ kc.T) * D, 0.0)
        out[sl] = np.exp(G)[:, None] * (qc @ Hs) + att @ U
        Hs = np.exp(G[-1]) * Hs + (kc * np.exp(G[-1] - G)[:, None]).T @ U
    return out[:n]


def causal_conv(x, w, keep_history=True):
    """x (n, C) over time, w (C, K): out_t = sum_i w[:, i] * x_{t-K+1+i} (zeros before 0)."""
    n, K = x.shape[0], w.shape[1]
    xp = np.concatenate([np.zeros((K - 1, x.shape[1])), x])
    out = np.zeros_like(x)
    for i in range(K):
        if not keep_history and i != K - 1:
            continue
        out += w[:, i] * xp[i:i + n]
    return out


class HybridParams:
    def __init__(self, m):
        g = lambda key, d=None: m.meta.get(f"{m.arch}.{key}", d)  # noqa: E731
        self.interval = int(g("full_attention_interval", 4))
        self.n_rot = int(g("rope.dimension_count", m.head_dim))
        self.nk = int(g("ssm.group_count"))
        self.nv = int(g("ssm.time_step_rank"))
        self.sd = int(g("ssm.state_size"))
        self.k_grouped = m.arch == "qwen3next"


def delta_layer(m, hp, h, p, lin, mutate, recurrent):
    n = h.shape[0]
    NK, NV, S = hp.nk, hp.nv, hp.sd
    qkv = lin(h, p + "attn_qkv.weight")
    z = lin(h, p + "attn_gate.weight").reshape(n, NV, S)
    if m.has(p + "ssm_ba.weight"):
        r = NV // NK
        ba = lin(h, p + "ssm_ba.weight").reshape(n, NK, 2, r)  # per key head: r betas, r alphas
        b, a = ba[:, :, 0, :].reshape(n, NV), ba[:, :, 1, :].reshape(n, NV)
    else:
        b, a = lin(h, p + "ssm_beta.weight"), lin(h, p + "ssm_alpha.weight")
    conv_w = m.W(p + "ssm_conv1d.weight").w  # (channels, K)
    c = rf.silu(causal_conv(qkv, conv_w, keep_history=mutate != "no_conv_history"))
    q = c[:, :NK * S].reshape(n, NK, S)
    k = c[:, NK * S:2 * NK * S].reshape(n, NK, S)
    v = c[:, 2 * NK * S:].reshape(n, NV, S)
    q = l2norm(q, m.eps) / np.sqrt(S)
    k = l2norm(k, m.eps)
    beta = sigmoid(b)
    g = softplus(a + m.vec(p + "ssm_dt.bias")) * m.vec(p + "ssm_a")
    if mutate == "no_decay":
        g = np.zeros_like(g)
    o = np.empty((n, NV, S))
    rule = gdn_recurrent if recurrent else gdn_chunked
    for j in range(NV):
        grouped = hp.k_grouped != (mutate == "gdn_head_map")
        kh = j // (NV // NK) if grouped else j % NK
        o[:, j] = rule(q[:, kh], k[:, kh], v[:, j], g[:, j], beta[:, j])
    o = rf.rmsnorm(o, m.vec(p + "ssm_norm.weight"), m.eps) * rf.silu(z)
    return lin(o.reshape(n, NV * S), p + "ssm_out.weight")


def attn_layer(m, hp, h, p, lin, pos, kv, mutate):
    n = h.shape[0]
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim
    qg = lin(h, p + "attn_q.weight").reshape(n, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(n, H * D)
    k, v = lin(h, p + "attn_k.weight").reshape(n, HKV, D), lin(h, p + "attn_v.weight").reshape(n, HKV, D)
    q, k = rf.rmsnorm(q, m.vec(p + "attn_q_norm.weight"), m.eps), rf.rmsnorm(k, m.vec(p + "attn_k_norm.weight"), m.eps)
    R = D if mutate == "full_rope" else hp.n_rot
    q = np.concatenate([rf.rope(q[..., :R], pos, m.rope_base, True), q[..., R:]], axis=-1)
    k = np.concatenate([rf.rope(k[..., :R], pos, m.rope_base, True), k[..., R:]], axis=-1)
    if kv:
        k, v = rf.kv_round(k, kv), rf.kv_round(v, kv)
    mask = pos[:, None] >= pos[None, :]
    att = np.empty((n, H, D))
    for hh in range(H):
        kh = hh // (H // HKV)
        s = np.where(mask, (q[:, hh] @ k[:, kh].T) / np.sqrt(D), -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh]
    att = att.reshape(n, H * D)
    if mutate != "no_attn_gate":
        att = att * sigmoid(gate)
    return lin(att, p + "attn_output.weight")


def forward(m, tokens, act_quant=False, kv=None, mutate=None, route=None, trace=None, recurrent=False, hidden=False):
    """Logits (n_tok, n_vocab) of a qwen35moe / qwen3next file, float64; with hidden, the final hidden
    states instead (after the output norm: what the MTP block reads, ref_mtp.py; "pre": before it)."""
    hp = HybridParams(m)
    tokens = np.asarray(tokens)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)

    def lin(x, name):
        w = m.W(name)
        xin = rf.quant_act(x, w.type) if act_quant else x
        return xin @ w.w.T

    def norm(x, name):
        return rf.rmsnorm(x, m.vec(name), m.eps)

    x = m.W("token_embd.weight").w[tokens].copy()
    for il in range(m.n_layer):
        p = f"blk.{il}."
        h = norm(x, p + "attn_norm.weight")
        if (il + 1) % hp.interval != 0:
            a = delta_layer(m, hp, h, p, lin, mutate, recurrent)
        else:
            a = attn_layer(m, hp, h, p, lin, pos, kv, mutate)
        x = x + a
        h = norm(x, p + "post_attention_norm.weight")
        if not m.n_expert:  # qwen35: dense SwiGLU
            x = x + lin(rf.silu(lin(h, p + "ffn_gate.weight")) * lin(h, p + "ffn_up.weight"), p + "ffn_down.weight")
            continue
        f = rf.moe(m, h, p, rf.silu, act_quant, choose=None if route is None else route[il], trace=trace, il=il)
        sh = lin(rf.silu(lin(h, p + "ffn_gate_shexp.weight")) * lin(h, p + "ffn_up_shexp.weight"),
                 p + "ffn_down_shexp.weight")
        if mutate != "no_shexp_gate":
            sh = sh * sigmoid(h @ m.vec(p + "ffn_gate_inp_shexp.weight"))[:, None]
        x = x + f + sh
    if hidden:
        return x if hidden == "pre" else norm(x, "output_norm.weight")
    out = "output.weight" if m.has("output.weight") else "token_embd.weight"
    return lin(norm(x, "output_norm.weight"), out)
