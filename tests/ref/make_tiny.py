"""Tiny random models for the forward-pass oracle, written with the gguf
package's GGUFWriter (not with `strata synth`: the oracle must not share code
with the engine it checks).

Each model has llama.cpp's metadata keys and tensor names for its family
(llama, qwen2, qwen3, qwen3moe, gemma3, the hybrid qwen35moe and
qwen3next: gated DeltaNet layers with a gated attention layer every 4th,
partial rotary, a shared expert; and glm4moe: sigmoid routing with a
selection bias, a leading dense layer, partial rotary), random weights, and a "mix" that says
which storage type each matrix gets. Types the gguf package can quantize
(F16, Q8_0, Q4_0) are quantized from Gaussian weights; K-quants and i-quants
are random valid blocks (random quant bits, finite f16 scales) rescaled so
that the dequantized matrix has the wanted standard deviation. The reference
(ref_forward.py) dequantizes whatever bytes are there with
gguf.quants.dequantize, so any valid block is as good a test as a quantized
one. Norm weights, biases and the MoE router stay F32, as llama.cpp keeps them.

    python make_tiny.py OUT.gguf ARCH MIX [--tied] [--seed N]
"""
import argparse
import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

# Hyper-parameters per family. Widths are multiples of 256 so that K-quant
# and i-quant rows are whole blocks. qwen3 and gemma3 have head_dim * n_head
# != n_embd (as the real models do); gemma3 has one KV head (as Gemma 3 1B)
# and 7 layers, so that both sliding-window layers (0-4, 6) and a global one
# (5) run.
ARCHS = {
    "llama": dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                  rope_base=10000.0, eps=1e-5, rope_freqs=True),
    "qwen2": dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                  rope_base=1000000.0, eps=1e-6, qkv_bias=True),
    "qwen3": dict(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                  rope_base=1000000.0, eps=1e-6, qk_norm=True),
    "qwen3moe": dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=0, n_vocab=512,
                     rope_base=1000000.0, eps=1e-6, qk_norm=True, n_expert=8, n_expert_used=2, n_ff_exp=256),
    "gemma3": dict(n_layer=7, n_embd=256, n_head=4, n_head_kv=1, head_dim=128, n_ff=512, n_vocab=512,
                   rope_base=1000000.0, eps=1e-6, qk_norm=True, post_norms=True, sliding_window=8,
                   rope_scale_linear=8.0),
    # Gemma 3 27B's shape rule: 62 layers, q.k scaled by n_embd / n_head (64 here) instead of head_dim (128)
    "gemma3-62": dict(arch="gemma3", n_layer=62, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=256,
                      n_vocab=512, rope_base=1000000.0, eps=1e-6, qk_norm=True, post_norms=True, sliding_window=8,
                      rope_scale_linear=8.0),
    # The hybrids (llama.cpp's qwen35moe.cpp / qwen3next.cpp): layers 0-2 gated
    # DeltaNet, layer 3 gated attention; 16 of 64 head values rotated (Qwen3.5 /
    # Qwen3-Next rotate 64 of 256); DeltaNet with 2 key heads and 4 value heads
    # of 64 (value head j reads key head j % 2 in qwen35moe, j // 2 in qwen3next, as llama.cpp maps them)
    "qwen35moe": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                      rope_base=10000000.0, eps=1e-6, qk_norm=True, n_expert=8, n_expert_used=2, n_ff_exp=256,
                      hybrid=True, n_rot=16, rope_sections=[3, 3, 2, 0], interval=4, d_conv=4, ssm_k_heads=2,
                      ssm_v_heads=4, ssm_head=64, n_ff_shexp=256),
    "qwen3next": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                      rope_base=10000000.0, eps=1e-6, qk_norm=True, n_expert=8, n_expert_used=2, n_ff_exp=256,
                      hybrid=True, n_rot=16, interval=4, d_conv=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head=64,
                      n_ff_shexp=256, ba_fused=True),
    # qwen35moe with an MTP block after the decoder (nextn_predict_layers 1, counted in block_count, as
    # converted Qwen3.5 files have it): engines that do not predict ahead must skip it
    "qwen35moe-mtp": dict(arch="qwen35moe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                          n_vocab=512, rope_base=10000000.0, eps=1e-6, qk_norm=True, n_expert=8, n_expert_used=2,
                          n_ff_exp=256, hybrid=True, n_rot=16, rope_sections=[3, 3, 2, 0], interval=4, d_conv=4,
                          ssm_k_heads=2, ssm_v_heads=4, ssm_head=64, n_ff_shexp=256, nextn=1),
    # Qwen3.5 dense: qwen35moe's layers with a plain SwiGLU FFN
    # GLM-4.5: a dense first layer, then sigmoid-routed experts with a selection
    # bias, scaled (GLM-4.5's 2.5), renormalised, plus an ungated shared
    # expert; q/k/v biases, half of each head rotated, q width 512 over d_model 256
    "glm4moe": dict(n_layer=3, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                    rope_base=1000000.0, eps=1e-5, qkv_bias=True, n_expert=8, n_expert_used=2, n_ff_exp=256,
                    glm=True, n_rot=32, dense_lead=1, n_shared=1, expert_scale=2.5),
    # GLM-4.5 (355B)'s q/k norms, two dense layers, no scale key, and an MTP block to skip
    "glm4moe-mtp": dict(arch="glm4moe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                        n_vocab=512, rope_base=1000000.0, eps=1e-5, qkv_bias=True, qk_norm=True, n_expert=8,
                        n_expert_used=2, n_ff_exp=256, glm=True, n_rot=32, dense_lead=2, n_shared=1, nextn=1),
    # gpt-oss: sinks, q/k/v/o biases, a window of 8 on layers 0 and 2, YaRN (factor 32) over a small
    # original context (4096 in the real models) so that 32 positions see its ramp; a router bias,
    # biased experts (gate/up biases wide enough that some values pass the +-7 clamp), top-4 of 8
    "gpt-oss": dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=0, n_vocab=512,
                    rope_base=150000.0, eps=1e-5, n_expert=8, n_expert_used=4, n_ff_exp=256, oss=True,
                    sliding_window=8, yarn_factor=32.0, yarn_orig_ctx=64),
    "qwen35": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=512,
                   rope_base=10000000.0, eps=1e-6, qk_norm=True, hybrid=True, n_rot=16, rope_sections=[3, 3, 2, 0],
                   interval=4, d_conv=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head=64),
}

# Storage type of each matrix per mix: (default, {name fragment: type}).
MIXES = {
    "f32": (QT.F32, {}),
    "f16": (QT.F16, {}),
    "q8_0": (QT.Q8_0, {}),
    "q4_0": (QT.Q4_0, {"token_embd": QT.Q8_0}),
    # llama.cpp's Q4_K_M pattern: V, FFN down and the output one step up
    "mxfp4": (QT.Q8_0, {"_exps.": QT.MXFP4}),  # gpt-oss as published: MXFP4 experts
    "q4k_q6k": (QT.Q4_K, {"attn_v": QT.Q6_K, "ffn_down": QT.Q6_K, "output.": QT.Q6_K, "token_embd": QT.Q6_K}),
    "iq4xs": (QT.IQ4_XS, {"token_embd": QT.Q4_K, "output.": QT.Q6_K}),
    "iq2_mix": (QT.IQ2_XS, {"attn_q.": QT.IQ2_XXS, "attn_k.": QT.IQ3_XXS, "ffn_down": QT.IQ3_S,
                            "token_embd": QT.Q5_K, "output.": QT.Q2_K, "attn_output": QT.Q3_K}),
}

# Random valid blocks: (byte offset of the f16 super-scale d, offset of dmin
# or None, dmin / d). dmin is set so that sub-blocks are centred on average
# (mean quant level times the mean scale), keeping the weights near zero-mean.
RANDOM_BLOCK_SCALES = {
    QT.Q2_K: (80, 82, 1.5),
    QT.Q3_K: (108, None, 0),
    QT.Q4_K: (0, 2, 7.5),
    QT.Q5_K: (0, 2, 15.5),
    QT.Q6_K: (208, None, 0),
    QT.IQ2_XXS: (0, None, 0),
    QT.IQ2_XS: (0, None, 0),
    QT.IQ2_S: (0, None, 0),
    QT.IQ3_XXS: (0, None, 0),
    QT.IQ3_S: (0, None, 0),
    QT.IQ4_XS: (0, None, 0),
    QT.IQ4_NL: (0, None, 0),
}


def _set_f16(raw, off, vals):
    raw[..., off:off + 2] = vals.astype(np.float16)[..., None].view(np.uint8)


def random_blocks(rng, qtype, rows, n_in, std):
    """uint8 array (*rows, row_bytes) of random valid blocks whose dequantized
    values have standard deviation `std`."""
    blck, tsize = GGML_QUANT_SIZES[qtype]
    assert n_in % blck == 0, (qtype.name, n_in)
    nb = n_in // blck
    d_off, m_off, m_ratio = RANDOM_BLOCK_SCALES[qtype]
    raw = rng.integers(0, 256, size=(*rows, nb, tsize), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, size=(*rows, nb))
    dm = d * m_ratio * rng.uniform(0.8, 1.2, size=d.shape)

    def fill(c):
        _set_f16(raw, d_off, d * c)
        if m_off is not None:
            _set_f16(raw, m_off, dm * c)
        return raw.reshape(*rows, nb * tsize)

    w = dequantize(fill(1.0), qtype)
    # scales enter linearly (w = d*sc*q - dmin*m), so one factor sets the spread
    return fill(std / float(np.std(w))).copy()


def make_weight(rng, qtype, rows, n_in, std):
    """(data, raw_dtype) for GGUFWriter.add_tensor: a Gaussian matrix quantized
    by the gguf package, or random valid blocks."""
    if qtype in RANDOM_BLOCK_SCALES:
        return random_blocks(rng, qtype, rows, n_in, std), qtype
    w = (rng.standard_normal((*rows, n_in)) * std).astype(np.float32)
    if qtype == QT.F32:
        return w, None
    if qtype == QT.F16:
        return w.astype(np.float16), None
    return quantize(w, qtype), qtype


def weight_type(mix, name):
    default, over = MIXES[mix]
    for frag, t in over.items():
        if frag in name:
            return t
    return default


def llama3_rope_freqs(head_dim, base, factor=8.0, low=1.0, high=4.0, orig_ctx=64):
    """The divisors of Llama 3.1's "llama3" rope scaling: 1 for pairs whose
    wavelength is short next to orig_ctx / high, `factor` for those longer than
    orig_ctx / low, a smooth blend between. orig_ctx is small here (8192 in the
    real models) so that the tiny test's 32 positions see every regime."""
    inv = base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    wavelen = 2 * np.pi / inv
    smooth = (orig_ctx / wavelen - low) / (high - low)
    div = np.where(wavelen < orig_ctx / high, 1.0,
                   np.where(wavelen > orig_ctx / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return div.astype(np.float32)


def make_model(path, arch, mix, tied=False, seed=0):
    """Writes the model; returns its hyper-parameter dict."""
    hp = dict(ARCHS[arch])
    arch = hp.pop("arch", arch)  # a variant of a family ("gemma3-62") writes that family
    rng = np.random.default_rng(seed)
    E, H, HKV, D = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    V, F = hp["n_vocab"], hp["n_ff"]
    w = GGUFWriter(path, arch)
    w.add_string("general.name", f"tiny-{arch}-{mix}")
    u32 = lambda k, v: w.add_uint32(f"{arch}.{k}", int(v))  # noqa: E731
    f32 = lambda k, v: w.add_float32(f"{arch}.{k}", float(v))  # noqa: E731
    u32("block_count", hp["n_layer"] + hp.get("nextn", 0))
    if hp.get("nextn"):
        u32("nextn_predict_layers", hp["nextn"])
    u32("embedding_length", E)
    if F:
        u32("feed_forward_length", F)
    u32("attention.head_count", H)
    u32("attention.head_count_kv", HKV)
    u32("attention.key_length", D)
    u32("attention.value_length", D)
    u32("context_length", 4096)
    f32("rope.freq_base", hp["rope_base"])
    f32("attention.layer_norm_rms_epsilon", hp["eps"])
    if "n_expert" in hp:
        u32("expert_count", hp["n_expert"])
        u32("expert_used_count", hp["n_expert_used"])
        u32("expert_feed_forward_length", hp["n_ff_exp"])
    if "sliding_window" in hp:
        u32("attention.sliding_window", hp["sliding_window"])
    if "rope_scale_linear" in hp:
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        f32("rope.scaling.factor", hp["rope_scale_linear"])
    if hp.get("hybrid"):
        u32("full_attention_interval", hp["interval"])
        u32("rope.dimension_count", hp["n_rot"])
        if "rope_sections" in hp:
            w.add_array(f"{arch}.rope.dimension_sections", hp["rope_sections"])
        u32("ssm.conv_kernel", hp["d_conv"])
        u32("ssm.state_size", hp["ssm_head"])
        u32("ssm.group_count", hp["ssm_k_heads"])
        u32("ssm.time_step_rank", hp["ssm_v_heads"])
        u32("ssm.inner_size", hp["ssm_v_heads"] * hp["ssm_head"])
        if "n_ff_shexp" in hp:
            u32("expert_shared_feed_forward_length", hp["n_ff_shexp"])
    if hp.get("glm"):  # keys as llama.cpp's converter writes them for Glm4MoeForCausalLM
        u32("rope.dimension_count", hp["n_rot"])
        u32("leading_dense_block_count", hp["dense_lead"])
        u32("expert_shared_count", hp["n_shared"])
        if "expert_scale" in hp:
            f32("expert_weights_scale", hp["expert_scale"])
        w.add_bool(f"{arch}.expert_weights_norm", True)
        u32("expert_gating_func", 2)  # sigmoid
    if hp.get("oss"):  # keys as llama.cpp's converter writes them for GptOssForCausalLM
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        f32("rope.scaling.factor", hp["yarn_factor"])
        u32("rope.scaling.original_context_length", hp["yarn_orig_ctx"])

    def mat(name, rows, n_in, std=None):
        t = weight_type(mix, name)
        data, raw = make_weight(rng, t, rows, n_in, std if std is not None else 1.0 / np.sqrt(n_in))
        w.add_tensor(name, data, raw_dtype=raw)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

    if hp.get("rope_freqs"):  # Llama 3.1's rope scaling as GGUF stores it: a divisor per rotated pair
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(D, hp["rope_base"]))
    # Gemma multiplies the embedding by sqrt(n_embd): small rows, as in the real models
    mat("token_embd.weight", (V,), E, std=(1.0 / np.sqrt(E)) if arch == "gemma3" else 1.0)
    vec("output_norm.weight", E)
    if not tied:
        mat("output.weight", (V,), E)
    for il in range(hp["n_layer"]):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        if hp.get("hybrid"):
            hybrid_layer(hp, il, p, mat, vec, w, rng)
            continue
        if hp.get("glm"):
            glm_layer(hp, il, p, mat, vec, w, rng)
            continue
        if hp.get("oss"):
            oss_layer(hp, p, mat, vec, w, rng)
            continue
        mat(p + "attn_q.weight", (H * D,), E)
        mat(p + "attn_k.weight", (HKV * D,), E)
        mat(p + "attn_v.weight", (HKV * D,), E)
        mat(p + "attn_output.weight", (E,), H * D)
        if hp.get("qkv_bias"):
            vec(p + "attn_q.bias", H * D, 0.0, 0.5)
            vec(p + "attn_k.bias", HKV * D, 0.0, 0.5)
            vec(p + "attn_v.bias", HKV * D, 0.0, 0.5)
        if hp.get("qk_norm"):
            vec(p + "attn_q_norm.weight", D)
            vec(p + "attn_k_norm.weight", D)
        if hp.get("post_norms"):
            vec(p + "post_attention_norm.weight", E)
            vec(p + "post_ffw_norm.weight", E)
        vec(p + "ffn_norm.weight", E)
        if "n_expert" in hp:
            X, FE = hp["n_expert"], hp["n_ff_exp"]
            w.add_tensor(p + "ffn_gate_inp.weight",
                         (rng.standard_normal((X, E)) / np.sqrt(E)).astype(np.float32))
            mat(p + "ffn_gate_exps.weight", (X, FE), E)  # ne {E, FE, X}
            mat(p + "ffn_up_exps.weight", (X, FE), E)
            mat(p + "ffn_down_exps.weight", (X, E), FE)  # ne {FE, E, X}
        else:
            mat(p + "ffn_gate.weight", (F,), E)
            mat(p + "ffn_up.weight", (F,), E)
            mat(p + "ffn_down.weight", (E,), F)
    for il in range(hp["n_layer"], hp["n_layer"] + hp.get("nextn", 0)):  # the MTP block (llama.cpp's names)
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        if hp.get("glm"):  # glm4moe's MTP block: a whole MoE layer plus the nextn tensors
            glm_layer(hp, il, p, mat, vec, w, rng)
            vec(p + "nextn.shared_head_norm.weight", E)
        else:
            hybrid_layer(dict(hp, interval=1), il, p, mat, vec, w, rng)  # a gated attention layer with its MoE
        mat(p + "nextn.eh_proj.weight", (E,), 2 * E)
        vec(p + "nextn.enorm.weight", E)
        vec(p + "nextn.hnorm.weight", E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hp


def hybrid_layer(hp, il, p, mat, vec, w, rng):
    """One layer of qwen35moe / qwen3next (names and shapes of llama.cpp's loaders)."""
    E, H, HKV, D = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    if (il + 1) % hp["interval"] == 0:  # gated attention: per head D query rows, then D gate rows
        mat(p + "attn_q.weight", (2 * H * D,), E)
        mat(p + "attn_k.weight", (HKV * D,), E)
        mat(p + "attn_v.weight", (HKV * D,), E)
        mat(p + "attn_output.weight", (E,), H * D)
        vec(p + "attn_q_norm.weight", D)
        vec(p + "attn_k_norm.weight", D)
    else:  # gated DeltaNet
        NK, NV, S, K = hp["ssm_k_heads"], hp["ssm_v_heads"], hp["ssm_head"], hp["d_conv"]
        conv = (2 * NK + NV) * S
        mat(p + "attn_qkv.weight", (conv,), E)
        mat(p + "attn_gate.weight", (NV * S,), E)
        if hp.get("ba_fused"):
            mat(p + "ssm_ba.weight", (2 * NV,), E)
        else:
            mat(p + "ssm_beta.weight", (NV,), E)
            mat(p + "ssm_alpha.weight", (NV,), E)
        w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv, K)) * 0.5).astype(np.float32))
        vec(p + "ssm_dt.bias", NV, 0.0, 1.0)
        # -exp(A_log): decay rates, A_log spread so that some heads forget fast and some slowly
        w.add_tensor(p + "ssm_a", (-np.exp(rng.uniform(-2.0, 1.5, NV))).astype(np.float32))
        vec(p + "ssm_norm.weight", S)
        mat(p + "ssm_out.weight", (E,), NV * S)
    vec(p + "post_attention_norm.weight", E)
    if "n_expert" not in hp:  # qwen35: dense FFN
        mat(p + "ffn_gate.weight", (hp["n_ff"],), E)
        mat(p + "ffn_up.weight", (hp["n_ff"],), E)
        mat(p + "ffn_down.weight", (E,), hp["n_ff"])
        return
    X, FE, FS = hp["n_expert"], hp["n_ff_exp"], hp["n_ff_shexp"]
    w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((X, E)) / np.sqrt(E)).astype(np.float32))
    mat(p + "ffn_gate_exps.weight", (X, FE), E)
    mat(p + "ffn_up_exps.weight", (X, FE), E)
    mat(p + "ffn_down_exps.weight", (X, E), FE)
    w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(E) / np.sqrt(E)).astype(np.float32))
    mat(p + "ffn_gate_shexp.weight", (FS,), E)
    mat(p + "ffn_up_shexp.weight", (FS,), E)
    mat(p + "ffn_down_shexp.weight", (E,), FS)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("arch", choices=sorted(ARCHS))
    ap.add_argument("mix", choices=sorted(MIXES))
    ap.add_argument("--tied", action="store_true", help="no output.weight: logits use token_embd")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    make_model(a.out, a.arch, a.mix, a.tied, a.seed)
    print(f"wrote {a.out}: {a.arch} {a.mix}{' tied' if a.tied else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])


def glm_layer(hp, il, p, mat, vec, w, rng):
    """A glm4moe layer after its attn_norm: attention with q/k/v biases (and
    q/k norms when asked), post_attention_norm (the pre-FFN norm), then a
    dense FFN (il < dense_lead) or the router, its selection bias, the
    experts and the shared expert (n_shared * n_ff_exp wide, no gate)."""
    E, H, HKV, D = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    mat(p + "attn_q.weight", (H * D,), E)
    mat(p + "attn_k.weight", (HKV * D,), E)
    mat(p + "attn_v.weight", (HKV * D,), E)
    vec(p + "attn_q.bias", H * D, 0.0, 0.5)
    vec(p + "attn_k.bias", HKV * D, 0.0, 0.5)
    vec(p + "attn_v.bias", HKV * D, 0.0, 0.5)
    mat(p + "attn_output.weight", (E,), H * D)
    if hp.get("qk_norm"):
        vec(p + "attn_q_norm.weight", D)
        vec(p + "attn_k_norm.weight", D)
    vec(p + "post_attention_norm.weight", E)
    if il < hp["dense_lead"]:
        F = hp["n_ff"]
        mat(p + "ffn_gate.weight", (F,), E)
        mat(p + "ffn_up.weight", (F,), E)
        mat(p + "ffn_down.weight", (E,), F)
        return
    X, FE, FS = hp["n_expert"], hp["n_ff_exp"], hp["n_ff_exp"] * hp["n_shared"]
    w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((X, E)) / np.sqrt(E)).astype(np.float32))
    # sigmoid scores of N(0, 1) logits differ by ~0.1: a bias of that size moves choices
    w.add_tensor(p + "exp_probs_b.bias", (0.1 * rng.standard_normal(X)).astype(np.float32))
    mat(p + "ffn_gate_exps.weight", (X, FE), E)
    mat(p + "ffn_up_exps.weight", (X, FE), E)
    mat(p + "ffn_down_exps.weight", (X, E), FE)
    mat(p + "ffn_gate_shexp.weight", (FS,), E)
    mat(p + "ffn_up_shexp.weight", (FS,), E)
    mat(p + "ffn_down_shexp.weight", (E,), FS)


def oss_layer(hp, p, mat, vec, w, rng):
    """A gpt-oss layer after its attn_norm (llama.cpp's openai-moe.cpp names):
    attention with q/k/v/o biases and a sink per head, post_attention_norm (the
    pre-FFN norm), the router with its bias, the experts with theirs."""
    E, H, HKV, D = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    X, FE = hp["n_expert"], hp["n_ff_exp"]
    mat(p + "attn_q.weight", (H * D,), E)
    mat(p + "attn_k.weight", (HKV * D,), E)
    mat(p + "attn_v.weight", (HKV * D,), E)
    vec(p + "attn_q.bias", H * D, 0.0, 0.5)
    vec(p + "attn_k.bias", HKV * D, 0.0, 0.5)
    vec(p + "attn_v.bias", HKV * D, 0.0, 0.5)
    mat(p + "attn_output.weight", (E,), H * D)
    vec(p + "attn_output.bias", E, 0.0, 0.5)
    vec(p + "attn_sinks.weight", H, 0.0, 1.0)
    vec(p + "post_attention_norm.weight", E)
    w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((X, E)) / np.sqrt(E)).astype(np.float32))
    vec(p + "ffn_gate_inp.bias", X, 0.0, 0.5)
    mat(p + "ffn_gate_exps.weight", (X, FE), E)
    mat(p + "ffn_up_exps.weight", (X, FE), E)
    mat(p + "ffn_down_exps.weight", (X, E), FE)
    w.add_tensor(p + "ffn_gate_exps.bias", (4.0 * rng.standard_normal((X, FE))).astype(np.float32))
    w.add_tensor(p + "ffn_up_exps.bias", (4.0 * rng.standard_normal((X, FE))).astype(np.float32))
    w.add_tensor(p + "ffn_down_exps.bias", (0.5 * rng.standard_normal((X, E))).astype(np.float32))
