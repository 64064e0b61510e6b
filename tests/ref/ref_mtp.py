"""NumPy reference of the multi-token prediction (MTP) block of the hybrid
Qwen family (Qwen3.5's MTP head; GGUF blk.{n_layer}.nextn.*, with
{arch}.nextn_predict_layers = 1), float64, written from the model's
definition as llama.cpp's GGUF stores it (the Qwen3-Next / Qwen3.5 MTP
module: pre_fc_norm_embedding -> nextn.enorm, pre_fc_norm_hidden ->
nextn.hnorm, fc -> nextn.eh_proj, norm -> nextn.shared_head_norm), not
from Strata's C.

At position p the block reads the token t_p and the main model's final
hidden state of position p - 1, h_{p-1} (after the output norm; zeros for
p = 0), and guesses t_{p+1}:
  x = eh_proj [RMSNorm(embed(t_p)) * enorm ; RMSNorm(h_{p-1}) * hnorm]   (embedding first)
  x += gated attention(RMSNorm(x) * attn_norm)        (causal, over the block's own positions)
  x += MoE(RMSNorm(x) * post_attention_norm) + sigmoid(gate . h) * shared expert
  o = RMSNorm(x) * shared_head_norm (output_norm when absent);  logits = o @ output^T
Chained drafting: after the pending token T at position n (with h_{n-1}),
each guess d_i is read at position n + i with the block's own o of the
position before it in place of h.

The attention and the experts are ref_hybrid's gated attention layer and
ref_forward's MoE, the same equations the main model's layers use. DeepSeek
V3's and GLM-4.5's MTP layer (deepseek2, glm4moe; the same nextn tensors,
embedding first in eh_proj's input as vLLM's and SGLang's DeepSeek MTP
read it) is one layer of the family's own decoder, ref_deepseek2.layer /
ref_glm4moe.layer.
`mutate` names a deliberate error (MUTATIONS), used by the test to show that
its tolerance catches them.
"""
import numpy as np

import ref_deepseek2 as rd
import ref_forward as rf
import ref_glm4moe as rg
import ref_hybrid as rh

MUTATIONS = ("swap_norms", "concat_order", "h_same_position", "no_attention", "no_shexp")


def _embed(m, p):
    name = p + "nextn.embed_tokens.weight"
    return m.W(name if m.has(name) else "token_embd.weight").w


def block(m, toks, hin, pos, kv=None, mutate=None):
    """The block over rows i (token toks[i] at position pos[i], hidden state hin[i]); attention is causal
    over these rows. Returns (o, logits), one row each."""
    p = f"blk.{m.n_layer}."

    def lin(x, name):
        return x @ m.W(name).w.T

    e = _embed(m, p)[np.asarray(toks)]
    wen, whn = m.vec(p + "nextn.enorm.weight"), m.vec(p + "nextn.hnorm.weight")
    if mutate == "swap_norms":
        wen, whn = whn, wen
    en, hn = rf.rmsnorm(e, wen, m.eps), rf.rmsnorm(hin, whn, m.eps)
    cat = np.concatenate([hn, en] if mutate == "concat_order" else [en, hn], axis=1)
    x = lin(cat, p + "nextn.eh_proj.weight")
    layer_mutate = mutate if mutate in ("no_attention", "no_shexp") else None
    if m.arch == "deepseek2":
        x = rd.layer(m, rd.params(m), m.n_layer, x, np.asarray(pos, dtype=np.float64), kv, layer_mutate)
    elif m.arch == "glm4moe":
        x = rg.layer(m, m.n_layer, x, np.asarray(pos, dtype=np.float64), kv=kv, mutate=layer_mutate)
    else:
        if mutate != "no_attention":
            x = x + rh.attn_layer(m, rh.HybridParams(m), rf.rmsnorm(x, m.vec(p + "attn_norm.weight"), m.eps), p,
                                  lin, pos, kv, None)
        h = rf.rmsnorm(x, m.vec(p + "post_attention_norm.weight"), m.eps)
        f = rf.moe(m, h, p, rf.silu, False)
        if mutate != "no_shexp":
            sh = lin(rf.silu(lin(h, p + "ffn_gate_shexp.weight")) * lin(h, p + "ffn_up_shexp.weight"),
                     p + "ffn_down_shexp.weight")
            f = f + sh * rh.sigmoid(h @ m.vec(p + "ffn_gate_inp_shexp.weight"))[:, None]
        x = x + f
    hn_name = p + "nextn.shared_head_norm.weight"
    o = rf.rmsnorm(x, m.vec(hn_name if m.has(hn_name) else "output_norm.weight"), m.eps)
    head = p + "nextn.shared_head_head.weight"
    if not m.has(head):
        head = "output.weight" if m.has("output.weight") else "token_embd.weight"
    return o, lin(o, head)


def hidden(m, toks, kv=None, pre=False):
    """The main model's final hidden states (after the output norm; before it with pre), (n, n_embd)."""
    hidden = "pre" if pre else True
    if m.arch == "deepseek2":
        return rd.forward(m, toks, kv=kv, hidden=hidden)
    if m.arch == "glm4moe":
        return rg.forward(m, toks, kv=kv, hidden=hidden)
    return rh.forward(m, toks, kv=kv, hidden=hidden)


def logits(m, toks, h_main, kv=None, mutate=None):
    """The block's logits at every position of toks: row p from t_p and h_{p-1}."""
    n = len(toks)
    hin = h_main if mutate == "h_same_position" else np.concatenate([np.zeros((1, h_main.shape[1])), h_main[:-1]])
    return block(m, toks, hin, np.arange(n, dtype=np.float64), kv, mutate)[1]


def chain(m, toks, h_main, pending, drafts, kv=None):
    """Logits of each chained step after toks: step 0 reads `pending` at position n with h_{n-1}, step i
    reads drafts[i - 1] with step i - 1's o (teacher-forced by the drafts given). (len(drafts), n_vocab)."""
    n = len(toks)
    rows_t = list(toks) + [pending]
    rows_h = [np.zeros(h_main.shape[1])] + list(h_main)  # row p reads h_{p-1}; row n reads h_{n-1}
    out = []
    for i in range(len(drafts)):
        o, lg = block(m, rows_t, np.array(rows_h), np.arange(len(rows_t), dtype=np.float64), kv)
        out.append(lg[-1])
        rows_t.append(drafts[i])
        rows_h.append(o[-1])
    assert len(rows_t) == n + 1 + len(drafts)
    return np.array(out)
