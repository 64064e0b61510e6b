/* Loading a model: hyper-parameters from GGUF metadata (keys prefixed by the
 * architecture name, as llama.cpp writes them), then every tensor bound by
 * name and checked for type and shape, so that a wrong or truncated file is
 * refused at load with a message naming the tensor, never mid-forward.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "model/arch_deepseek2_names.h"
#include "model/arch_hybrid_names.h"
#include "core/switches.h"
#include "quant/quant.h"

typedef struct {
    gguf_file *f;
    const char *arch;
    int failed;
} loader;

/* "{arch}.suffix" metadata keys. */
static int get_u32(loader *L, const char *suffix, int required, uint32_t def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    uint32_t v;
    if (gguf_get_u32(L->f, key, &v) == 0) return (int)v;
    if (required && !L->failed) {
        st_error_set("%s: missing or invalid metadata key '%s'", gguf_path(L->f), key);
        L->failed = 1;
    }
    return (int)def;
}

static float get_f32(loader *L, const char *suffix, float def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    float v;
    return gguf_get_f32(L->f, key, &v) == 0 ? v : def;
}

/* Bind a 2-D or 3-D weight; shape ne = {n_in, n_out, n_mat}. Missing and
 * optional -> data NULL. */
static st_weight get_weight(loader *L, const char *name, int64_t n_in, int64_t n_out, int64_t n_mat, int required) {
    st_weight w = {0};
    if (L->failed) return w;
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t) {
        if (required) {
            st_error_set("%s: missing tensor '%s'", gguf_path(L->f), name);
            L->failed = 1;
        }
        return w;
    }
    int64_t want[3] = {n_in, n_out, n_mat};
    for (int d = 0; d < 3; d++) {
        int64_t have = d < t->n_dims ? t->ne[d] : 1;
        if (have != want[d]) {
            st_error_set("%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", gguf_path(L->f),
                         name, (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1),
                         (long long)(t->n_dims > 2 ? t->ne[2] : 1), (long long)n_in, (long long)n_out,
                         (long long)n_mat);
            L->failed = 1;
            return w;
        }
    }
    if (!qt_get(t->type) || !qt_get(t->type)->dequant) {
        st_error_set("%s: tensor '%s' has type %d, which Strata cannot compute with", gguf_path(L->f), name, t->type);
        L->failed = 1;
        return w;
    }
    w.data = t->data;
    w.type = (qt_type)t->type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.n_mat = n_mat;
    w.row_bytes = qt_row_size(w.type, n_in);
    return w;
}

/* A 1-D f32 vector (norm weight, bias), or a small 2-D table of n_in x n_out
 * read the same way (a convolution kernel); converted to f32 if stored otherwise. */
static const float *get_vec(loader *L, model *m, const char *name, int64_t n_in, int64_t n_out, int required) {
    st_weight w = get_weight(L, name, n_in, n_out, 1, required);
    if (!w.data) return NULL;
    const int64_t n = n_in * n_out;
    if (w.type == QT_F32) return (const float *)w.data;
    float *copy = st_malloc((size_t)n * sizeof(float));
    qt_dequantize(w.type, w.data, copy, n);
    m->owned = st_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(float *));
    m->owned[m->n_owned++] = copy;
    return copy;
}

/* A routed-experts family's keys. */
static int moe_hparams(loader *L, model_hparams *hp) {
    hp->n_expert = get_u32(L, "expert_count", 1, 0);
    hp->n_expert_used = get_u32(L, "expert_used_count", 1, 0);
    hp->n_ff_exp = get_u32(L, "expert_feed_forward_length", 1, 0);
    hp->norm_topk = 1; /* Qwen3-MoE renormalises its top-k weights (norm_topk_prob) */
    char key[128];
    int normw;
    snprintf(key, sizeof key, "%s.expert_weights_norm", L->arch);
    if (gguf_get_bool(L->f, key, &normw) == 0) hp->norm_topk = normw;
    if (L->failed) return -1;
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp <= 0) {
        st_error_set("%s: inconsistent MoE hyper-parameters (experts %d, used %d, ff %d)", gguf_path(L->f),
                     hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
        return -1;
    }
    return 0;
}

/* Gemma 3: sliding-window layers with their own rope base, a scaled embedding. */
static int gemma3_hparams(loader *L, model_hparams *hp) {
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->n_swa = get_u32(L, "attention.sliding_window", 1, 0);
    hp->swa_pattern = 6; /* five local layers, then one global (Gemma 3) */
    hp->rope_theta_swa = 10000.0f;
    /* Gemma 3 27B scales q.k by 1/sqrt(n_embd / n_head) (its query_pre_attn_scalar 168 = 5376 / 32),
     * the others by 1/sqrt(head_dim); GGUF does not store the scalar, so the 27B is known by its
     * 62 layers, as llama.cpp does */
    if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)hp->n_embd / (float)hp->n_head);
    return L->failed ? -1 : 0;
}

/* An integer array's elements (n at most), -1 when absent or not integers. */
static int get_arr(loader *L, const char *suffix, int64_t *out, int n) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    int64_t i = gguf_find_key(L->f, key);
    gguf_value v;
    if (i < 0 || gguf_get_value(L->f, i, &v) != 0 || v.type != GGUF_T_ARRAY) return -1;
    for (uint64_t j = 0; j < v.n && j < (uint64_t)n; j++)
        if (gguf_arr_get_i64(&v, j, &out[j]) != 0) return -1;
    return (int)(v.n < (uint64_t)n ? v.n : (uint64_t)n);
}

/* The hybrid Qwen family (qwen3next, qwen35moe, dense qwen35): gated DeltaNet
 * layers, a gated attention layer every full_attention_interval-th, partial
 * rotary, a shared expert beside the routed ones (the MoE ones). Keys as
 * llama.cpp writes them. */
static int hybrid_hparams(loader *L, model_hparams *hp) {
    hp->full_attn_interval = get_u32(L, "full_attention_interval", 0, 4);
    hp->ssm_d_conv = get_u32(L, "ssm.conv_kernel", 1, 0);
    const int inner = get_u32(L, "ssm.inner_size", 1, 0);
    hp->ssm_head_dim = get_u32(L, "ssm.state_size", 1, 0);
    hp->ssm_n_v_head = get_u32(L, "ssm.time_step_rank", 1, 0);
    hp->ssm_n_k_head = get_u32(L, "ssm.group_count", 1, 0);
    hp->n_ff_shexp = hp->n_expert ? get_u32(L, "expert_shared_feed_forward_length", 0, (uint32_t)hp->n_ff) : 0;
    hp->n_rot = get_u32(L, "rope.dimension_count", 0, (uint32_t)hp->head_dim);
    hp->ba_fused = hp->arch == ARCH_QWEN3NEXT;
    hp->shexp_gated = 1;
    hp->ffn_norm_post = 1;
    /* block_count counts the multi-token-prediction layers after the decoder's
     * (nextn_predict_layers, Qwen3.5's MTP head): bound by bind_mtp, run only
     * by --draft mtp (forward.c model_forward_mtp) */
    const int nextn = get_u32(L, HYBRID_KV_NEXTN, 0, 0);
    hp->n_nextn = nextn;
    if (L->failed) return -1;
    if (nextn < 0 || nextn >= hp->n_layer) {
        st_error_set("%s: %d of %d layers are prediction (nextn) layers", gguf_path(L->f), nextn, hp->n_layer);
        return -1;
    }
    hp->n_layer -= nextn;
    if (hp->full_attn_interval <= 0 || hp->ssm_d_conv < 1 || hp->ssm_head_dim <= 0 || hp->ssm_n_k_head <= 0 ||
        hp->ssm_n_v_head % hp->ssm_n_k_head != 0 || inner != hp->ssm_n_v_head * hp->ssm_head_dim ||
        (hp->n_expert && hp->n_ff_shexp <= 0) || hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        st_error_set("%s: inconsistent DeltaNet hyper-parameters (interval %d, conv %d, inner %d, state %d, "
                     "heads %d/%d, shared ff %d, rope dims %d)",
                     gguf_path(L->f), hp->full_attn_interval, hp->ssm_d_conv, inner, hp->ssm_head_dim, hp->ssm_n_k_head,
                     hp->ssm_n_v_head, hp->n_ff_shexp, hp->n_rot);
        return -1;
    }
    /* a per-layer list of which layers are recurrent: only the regular pattern is supported */
    int64_t *recr = st_calloc((size_t)hp->n_layer, sizeof(int64_t));
    int n = get_arr(L, "attention.recurrent_layers", recr, hp->n_layer);
    for (int il = 0; il < n; il++)
        if ((recr[il] != 0) != model_layer_recurrent(hp, il)) {
            st_error_set("%s: recurrent layers other than every layer but each %d-th are not supported",
                         gguf_path(L->f), hp->full_attn_interval);
            n = -2;
            break;
        }
    st_free(recr);
    if (n == -2) return -1;
    /* qwen35moe's interleaved M-RoPE gives text tokens the same position in
     * its three sections: the plain NeoX rotation, as long as the sections
     * cover every rotated pair (the others would turn by position 0) */
    int64_t sec[4] = {0};
    if (get_arr(L, "rope.dimension_sections", sec, 4) > 0) {
        const int64_t dims = sec[0] + sec[1] + sec[2] + sec[3];
        for (int i = 0; i < hp->n_rot / 2; i++) {
            const int64_t sc = dims > 0 ? i % dims : 0;
            if (!(sc < 3 * sec[sc % 3])) {
                st_error_set("%s: rope sections [%lld, %lld, %lld, %lld] leave rotated pair %d unset", gguf_path(L->f),
                             (long long)sec[0], (long long)sec[1], (long long)sec[2], (long long)sec[3], i);
                return -1;
            }
        }
    }
    return 0;
}

/* GLM-4.5 / 4.6 (glm4moe), keys as llama.cpp b11434 reads them: the first
 * leading_dense_block_count layers have a dense FFN, the others routed
 * experts chosen by sigmoid(logits) + exp_probs_b (the bias steers the
 * choice only), weights renormalised (expert_weights_norm, default off as in
 * llama.cpp) and scaled (expert_weights_scale), plus expert_shared_count
 * ungated shared experts of the routed width; partial NeoX rotary
 * (rope.dimension_count); q/k/v biases and q/k norms when the file has them
 * (GLM-4.5-Air: biases, no norms); the NextN/MTP layers counted in
 * block_count are not run. */
static int glm4moe_hparams(loader *L, model_hparams *hp) {
    hp->n_dense_lead = get_u32(L, "leading_dense_block_count", 0, 0);
    hp->n_ff = get_u32(L, "feed_forward_length", hp->n_dense_lead > 0, 0);
    const int n_shared = get_u32(L, "expert_shared_count", 1, 0);
    hp->n_ff_shexp = n_shared * hp->n_ff_exp;
    hp->ffn_norm_post = 1;
    hp->exp_bias = 1;
    const int gating = get_u32(L, "expert_gating_func", 0, 2); /* llama.cpp: 1 softmax, 2 sigmoid (absent: sigmoid) */
    hp->gate_fn = gating == 1 ? ST_GATE_SOFTMAX : ST_GATE_SIGMOID;
    const float scale = get_f32(L, "expert_weights_scale", 0.0f);
    hp->expert_scale = scale != 0.0f ? scale : 1.0f;
    char key[128];
    int normw = 0;
    snprintf(key, sizeof key, "%s.expert_weights_norm", L->arch);
    hp->norm_topk = gguf_get_bool(L->f, key, &normw) == 0 ? normw : 0;
    const int groups = get_u32(L, "expert_group_count", 0, 0);
    hp->n_rot = get_u32(L, "rope.dimension_count", 0, (uint32_t)hp->head_dim);
    const int nextn = get_u32(L, "nextn_predict_layers", 0, 0);
    if (L->failed) return -1;
    if ((gating != 1 && gating != 2) || groups > 1 || nextn < 0 || nextn >= hp->n_layer || hp->n_dense_lead < 0 ||
        hp->n_dense_lead > hp->n_layer - nextn || n_shared < 0 || (hp->n_dense_lead > 0 && hp->n_ff <= 0) ||
        hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        st_error_set("%s: unsupported glm4moe hyper-parameters (gating %d, expert groups %d, nextn %d of %d "
                     "layers, dense lead %d, shared %d, ff %d, rope dims %d)",
                     gguf_path(L->f), gating, groups, nextn, hp->n_layer, hp->n_dense_lead, n_shared, hp->n_ff,
                     hp->n_rot);
        return -1;
    }
    hp->n_nextn = nextn; /* the MTP layer after the decoder's: bind_mtp */
    hp->n_layer -= nextn;
    /* GLM-4.5V's M-RoPE sections: its text positions would need the vision layout; not supported */
    int64_t sec[4] = {0};
    if (get_arr(L, "rope.dimension_sections", sec, 4) > 0 && (sec[0] || sec[1] || sec[2] || sec[3])) {
        st_error_set("%s: glm4moe with M-RoPE sections (GLM-4.5V) is not supported", gguf_path(L->f));
        return -1;
    }
    /* optional per file, all layers alike: read from layer 0, as the tensor table then binds them all */
    hp->qkv_bias = gguf_find_tensor(L->f, "blk.0.attn_q.bias") != NULL;
    hp->qk_norm = gguf_find_tensor(L->f, "blk.0.attn_q_norm.weight") != NULL;
    return 0;
}

/* YaRN's frequencies as per-pair divisors of the plain rope's (the
 * mechanism of rope_freqs, so no rope op knows YaRN): pair i of n_dims turns
 * at a mix of its own frequency (extrapolation) and the frequency / factor
 * (interpolation), ramping from extrapolated below the correction range
 * [lo, hi] to interpolated above it, where lo, hi are the pairs that turn
 * beta_fast and beta_slow times over the original context; ext scales the
 * extrapolated share. round_out rounds lo, hi outwards to whole pairs, as
 * ggml's ggml_rope_yarn_corr_dims and DeepSeek's reference code do; OpenAI's
 * gpt-oss reference keeps them as they are. The divisors are m's (m->owned)
 * and become m->rope_freqs; the magnitude factor is each family's business
 * (the attention scale). */
static void yarn_divisors(model *m, int n_dims, int orig_ctx, float factor, float beta_fast, float beta_slow, float ext,
                          int round_out) {
    const double lb = 2.0 * log((double)m->hp.rope_theta);
    double lo = n_dims * log(orig_ctx / (beta_fast * 2.0 * M_PI)) / lb;
    double hi = n_dims * log(orig_ctx / (beta_slow * 2.0 * M_PI)) / lb;
    if (round_out) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > n_dims - 1) hi = n_dims - 1;
    const int half = n_dims / 2;
    float *div = st_malloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++) {
        double r = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001); /* 0 below the range, 1 above */
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        const double mix = (1.0 - r) * ext; /* the share of the extrapolated frequency */
        div[i] = (float)(1.0 / ((1.0 - mix) / factor + mix));
    }
    m->owned = st_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(float *));
    m->owned[m->n_owned++] = div;
    m->rope_freqs = div;
}

/* DeepSeek V2/V3/R1 and Kimi K2 (deepseek2), keys as llama.cpp b11434 reads
 * them (arch_deepseek2_names.h): multi-head latent attention, whose cache
 * row (key_length = kv_lora_rank + rope dims, one KV head) is head_dim here;
 * leading dense layers; routed experts by softmax (V2; the default when
 * expert_gating_func is absent, as in llama.cpp) or sigmoid (V3) with an
 * optional selection bias, group-limited top-k (expert_group_count /
 * expert_group_used_count), weights renormalised (expert_weights_norm,
 * default off) and scaled; expert_shared_count shared experts; YaRN rope
 * with DeepSeek's mscale folded into the attention scale; the MTP layers
 * counted in block_count are loaded past, not run. */
static int deepseek2_hparams(loader *L, model_hparams *hp) {
    hp->n_dense_lead = get_u32(L, "leading_dense_block_count", 0, 0);
    hp->n_ff = get_u32(L, "feed_forward_length", hp->n_dense_lead > 0, 0);
    hp->q_lora = get_u32(L, DEEPSEEK2_KV_Q_LORA, 0, 0); /* absent: a plain attn_q (V2-Lite) */
    hp->kv_lora = get_u32(L, DEEPSEEK2_KV_KV_LORA, 1, 0);
    hp->head_dim_mla = get_u32(L, DEEPSEEK2_KV_KEY_LENGTH_MLA, 1, 0);
    hp->v_head_mla = get_u32(L, DEEPSEEK2_KV_VALUE_LENGTH_MLA, 1, 0);
    hp->n_rot = get_u32(L, "rope.dimension_count", 1, 0);
    const int vlen = get_u32(L, "attention.value_length", 1, 0);
    const int n_shared = get_u32(L, "expert_shared_count", 1, 0);
    hp->n_ff_shexp = n_shared * hp->n_ff_exp;
    const int gating = get_u32(L, "expert_gating_func", 0, 1); /* absent: softmax, as llama.cpp for V2 files */
    hp->gate_fn = gating == 2 ? ST_GATE_SIGMOID : ST_GATE_SOFTMAX;
    const float scale = get_f32(L, "expert_weights_scale", 0.0f);
    hp->expert_scale = scale != 0.0f ? scale : 1.0f;
    char key[128];
    int normw = 0;
    snprintf(key, sizeof key, "%s.expert_weights_norm", L->arch);
    hp->norm_topk = gguf_get_bool(L->f, key, &normw) == 0 ? normw : 0;
    hp->n_group = get_u32(L, DEEPSEEK2_KV_GROUP_COUNT, 0, 0);
    hp->n_group_used = get_u32(L, DEEPSEEK2_KV_GROUP_USED, hp->n_group > 1, 0);
    const int nextn = get_u32(L, "nextn_predict_layers", 0, 0);
    if (L->failed) return -1;
    const int nope = hp->head_dim_mla - hp->n_rot;
    if ((gating != 1 && gating != 2) || nextn < 0 || nextn >= hp->n_layer || hp->n_dense_lead < 0 ||
        hp->n_dense_lead > hp->n_layer - nextn || n_shared < 0 || (hp->n_dense_lead > 0 && hp->n_ff <= 0) ||
        hp->kv_lora <= 0 || hp->q_lora < 0 || hp->n_rot <= 0 || hp->n_rot % 2 || nope < 1 || hp->v_head_mla <= 0 ||
        hp->n_head_kv != 1 || hp->head_dim != hp->kv_lora + hp->n_rot || vlen != hp->kv_lora ||
        (hp->n_group > 1 && (hp->n_expert % hp->n_group || hp->n_group_used < 1 || hp->n_group_used >= hp->n_group ||
                             hp->n_expert_used > hp->n_group_used * (hp->n_expert / hp->n_group))) ||
        hp->n_group < 0 || hp->n_group > 64) { /* cpu_route_groups' limit; V3 has 8 */
        st_error_set("%s: unsupported deepseek2 hyper-parameters (gating %d, nextn %d of %d layers, dense lead %d, "
                     "shared %d, kv heads %d, key/value length %d/%d for kv_lora_rank %d + rope %d, mla heads %d/%d, "
                     "expert groups %d/%d of %d experts)",
                     gguf_path(L->f), gating, nextn, hp->n_layer, hp->n_dense_lead, n_shared, hp->n_head_kv,
                     hp->head_dim, vlen, hp->kv_lora, hp->n_rot, hp->head_dim_mla, hp->v_head_mla, hp->n_group_used,
                     hp->n_group, hp->n_expert);
        return -1;
    }
    if (hp->n_group <= 1) hp->n_group = hp->n_group_used = 0;
    hp->n_nextn = nextn; /* the MTP layer after the decoder's: bind_mtp */
    hp->n_layer -= nextn;
    if (gguf_find_tensor(L->f, "blk.0." DEEPSEEK2_T_ATTN_KV_B)) {
        st_error_set("%s: deepseek2 with an unsplit attn_kv_b (a GGUF from before llama.cpp's MLA split); "
                     "convert it again with a current convert_hf_to_gguf.py",
                     gguf_path(L->f));
        return -1;
    }
    /* the selection bias is optional per file (V3 has it, V2 not); all MoE layers alike */
    snprintf(key, sizeof key, "blk.%d.exp_probs_b.bias", hp->n_dense_lead);
    hp->exp_bias = gguf_find_tensor(L->f, key) != NULL;
    /* YaRN (llama.cpp's yarn_attn_factor and deepseek2 graph): the rope itself
     * ends up unscaled, the attention scale is mscale^2 / sqrt(key_length_mla)
     * with mscale = 1 + 0.1 * mscale_all_dim * ln(factor) */
    float mscale = 1.0f;
    const char *st;
    uint64_t slen;
    snprintf(key, sizeof key, "%s.%s", L->arch, DEEPSEEK2_KV_ROPE_SCALING);
    if (gguf_get_str(L->f, key, &st, &slen) == 0 && !(slen == 4 && !memcmp(st, "none", 4))) {
        if (!(slen == 4 && !memcmp(st, "yarn", 4))) {
            st_error_set("%s: deepseek2 with rope scaling '%.*s' (only yarn is supported)", gguf_path(L->f),
                         (int)(slen > 32 ? 32 : slen), st);
            return -1;
        }
        const float factor = get_f32(L, DEEPSEEK2_KV_ROPE_FACTOR, 0.0f);
        hp->yarn_orig_ctx = get_u32(L, DEEPSEEK2_KV_ROPE_ORIG_CTX, 0, (uint32_t)hp->n_ctx_train);
        hp->yarn_beta_fast = get_f32(L, DEEPSEEK2_KV_YARN_BETA_FAST, 32.0f);
        hp->yarn_beta_slow = get_f32(L, DEEPSEEK2_KV_YARN_BETA_SLOW, 1.0f);
        /* without the multiplier llama.cpp's rope would scale the rotated part alone: not supported */
        snprintf(key, sizeof key, "%s.%s", L->arch, DEEPSEEK2_KV_YARN_LOG_MUL);
        float log_mul = 0.0f;
        if (gguf_get_f32(L->f, key, &log_mul) != 0) {
            st_error_set("%s: YaRN rope without metadata key '%s'", gguf_path(L->f), key);
            return -1;
        }
        log_mul /= 0.1f; /* mscale_all_dim */
        if (!(factor > 0.0f) || hp->yarn_orig_ctx <= 0) {
            st_error_set("%s: YaRN rope without a valid '%s.%s' (%g)", gguf_path(L->f), L->arch,
                         DEEPSEEK2_KV_ROPE_FACTOR, (double)factor);
            return -1;
        }
        hp->rope_freq_scale = 1.0f / factor;
        if (factor > 1.0f) mscale = 1.0f + 0.1f * log_mul * logf(factor);
    }
    hp->attn_scale = mscale * mscale / sqrtf((float)hp->head_dim_mla);
    /* what llama.cpp would also apply but V2/V3/K2 files do not carry: refused rather than ignored */
    const float attn_factor = get_f32(L, "rope.scaling.attn_factor", 1.0f),
                temp_scale = get_f32(L, "attention.temperature_scale", 0.0f);
    if (attn_factor != 1.0f || temp_scale != 0.0f) {
        st_error_set("%s: deepseek2 with rope.scaling.attn_factor %g or attention.temperature_scale %g "
                     "(attention temperature tuning) is not supported",
                     gguf_path(L->f), (double)attn_factor, (double)temp_scale);
        return -1;
    }
    return 0;
}

/* gpt-oss (gpt-oss-20b / 120b), keys as llama.cpp b11434 reads them: every
 * layer MoE with a router bias and per-expert biases, the clamped SwiGLU
 * (ARCHS' act), attention sinks and an output bias, q/k/v biases, a sliding
 * window (attention.sliding_window, required) on layers il % 2 == 0 (llama.cpp's
 * set_swa_pattern(2): every other layer, the first sliding), YaRN on every layer;
 * the router's weights are the softmax of the chosen top-k logits, which is
 * the softmax over all experts renormalised over the chosen: qwen's routing. */
static int gpt_oss_hparams(loader *L, model_hparams *hp) {
    hp->n_swa = get_u32(L, "attention.sliding_window", 1, 0);
    hp->swa_pattern = get_u32(L, "attention.sliding_window_pattern", 0, 2);
    hp->rope_theta_swa = get_f32(L, "rope.freq_base_swa", hp->rope_theta);
    hp->swa_rope_global = 1;
    hp->qkv_bias = 1;
    hp->attn_sinks = 1;
    hp->exps_bias = 1;
    hp->ffn_norm_post = 1;
    hp->norm_topk = 1;
    hp->n_rot = get_u32(L, "rope.dimension_count", 0, (uint32_t)hp->head_dim);
    if (L->failed) return -1;
    int64_t pat[8];
    if (hp->n_swa <= 0 || hp->swa_pattern != 2 || get_arr(L, "attention.sliding_window_pattern", pat, 8) > 0 ||
        hp->n_rot != hp->head_dim) {
        st_error_set("%s: unsupported gpt-oss hyper-parameters (sliding window %d, pattern %d or a per-layer "
                     "array, rope dims %d of %d)",
                     gguf_path(L->f), hp->n_swa, hp->swa_pattern, hp->n_rot, hp->head_dim);
        return -1;
    }
    return 0;
}

/* YaRN of gpt-oss (rope.scaling.type "yarn"): the divisors above, the
 * correction range kept unrounded as OpenAI's reference (and transformers
 * with truncate=false) compute it; llama.cpp b11434 rounds it outwards
 * (STRATA_YARN_TRUNCATE=1 does). The magnitude factor m = 0.1 ln(factor) + 1
 * that multiplies cos and sin multiplies q.k by m^2: it goes into attn_scale. */
static int yarn_hparams(loader *L, model *m) {
    model_hparams *hp = &m->hp;
    const float factor = get_f32(L, "rope.scaling.factor", 0.0f);
    const int orig = get_u32(L, "rope.scaling.original_context_length", 0, (uint32_t)hp->n_ctx_train);
    const float beta_fast = get_f32(L, "rope.scaling.yarn_beta_fast", 32.0f);
    const float beta_slow = get_f32(L, "rope.scaling.yarn_beta_slow", 1.0f);
    const float ext = get_f32(L, "rope.scaling.yarn_ext_factor", 1.0f);
    const float attn_factor = get_f32(L, "rope.scaling.attn_factor", 1.0f);
    const float log_mul = get_f32(L, "rope.scaling.yarn_log_multiplier", 0.0f);
    if (!(factor >= 1.0f) || orig <= 0 || log_mul != 0.0f || m->rope_freqs) {
        st_error_set("%s: unsupported YaRN parameters (factor %g, original context %d, log multiplier %g%s)",
                     gguf_path(L->f), (double)factor, orig, (double)log_mul, m->rope_freqs ? ", with rope_freqs" : "");
        return -1;
    }
    const int d = hp->n_rot > 0 ? hp->n_rot : hp->head_dim;
    const char *tr = st_switch_get("STRATA_YARN_TRUNCATE");
    yarn_divisors(m, d, orig, factor, beta_fast, beta_slow, ext, tr && !strcmp(tr, "1"));
    const float ms = ext != 0.0f ? (0.1f * logf(factor) + 1.0f) * attn_factor : attn_factor;
    hp->attn_scale *= ms * ms;
    hp->rope_freq_scale = 1.0f;
    return 0;
}

/* The families, as data: one row each, its GGUF name, the decoder's
 * switches it sets, and a hook for what only it reads (docs/contributing.md). */
typedef struct {
    const char *name; /* general.architecture, as llama.cpp writes it */
    int rope_neox;    /* rotate pairs (i, i + d/2), else adjacent pairs */
    int qkv_bias, qk_norm, post_norms;
    int moe; /* routed experts in every layer (moe_hparams) */
    st_act act;
    int (*extra)(loader *L, model_hparams *hp);
} arch_def;

static const arch_def ARCHS[ARCH_COUNT] = {
    [ARCH_LLAMA] = {"llama", 0, 0, 0, 0, 0, ST_ACT_SILU, NULL},
    [ARCH_QWEN2] = {"qwen2", 1, 1, 0, 0, 0, ST_ACT_SILU, NULL},
    [ARCH_QWEN3] = {"qwen3", 1, 0, 1, 0, 0, ST_ACT_SILU, NULL},
    [ARCH_QWEN3MOE] = {"qwen3moe", 1, 0, 1, 0, 1, ST_ACT_SILU, NULL},
    [ARCH_GEMMA3] = {"gemma3", 1, 0, 1, 1, 0, ST_ACT_GELU, gemma3_hparams},
    [ARCH_QWEN3NEXT] = {"qwen3next", 1, 0, 1, 0, 1, ST_ACT_SILU, hybrid_hparams},
    [ARCH_QWEN35MOE] = {"qwen35moe", 1, 0, 1, 0, 1, ST_ACT_SILU, hybrid_hparams},
    [ARCH_QWEN35] = {"qwen35", 1, 0, 1, 0, 0, ST_ACT_SILU, hybrid_hparams},          /* qwen35moe with a dense FFN */
    [ARCH_GLM4MOE] = {"glm4moe", 1, 0, 0, 0, 1, ST_ACT_SILU, glm4moe_hparams},       /* biases, norms: by the file */
    [ARCH_DEEPSEEK2] = {"deepseek2", 0, 0, 0, 0, 1, ST_ACT_SILU, deepseek2_hparams}, /* adjacent-pair rope */
    [ARCH_GPT_OSS] = {"gpt-oss", 1, 1, 0, 0, 1, ST_ACT_SWIGLU_OAI, gpt_oss_hparams},
};

const char *model_arch_name(model_arch a) { return (a >= 0 && a < ARCH_COUNT) ? ARCHS[a].name : "?"; }

int model_arch_from_name(const char *name, uint64_t len) {
    for (int i = 0; i < ARCH_COUNT; i++)
        if (strlen(ARCHS[i].name) == len && !memcmp(ARCHS[i].name, name, len)) return i;
    return -1;
}

static int load_hparams(loader *L, model_hparams *hp) {
    hp->n_layer = get_u32(L, "block_count", 1, 0);
    hp->n_embd = get_u32(L, "embedding_length", 1, 0);
    hp->n_head = get_u32(L, "attention.head_count", 1, 0);
    hp->n_head_kv = get_u32(L, "attention.head_count_kv", 0, (uint32_t)hp->n_head);
    hp->n_ctx_train = get_u32(L, "context_length", 1, 0);
    if (L->failed) return -1;
    if (hp->n_layer <= 0 || hp->n_layer > 4096 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->n_ctx_train <= 0) {
        st_error_set("%s: inconsistent hyper-parameters (layers %d, embd %d, heads %d/%d, ctx %d)", gguf_path(L->f),
                     hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ctx_train);
        return -1;
    }
    hp->head_dim = get_u32(L, "attention.key_length", 0, (uint32_t)(hp->n_embd / hp->n_head));
    int vdim = get_u32(L, "attention.value_length", 0, (uint32_t)hp->head_dim);
    /* deepseek2's value rows are the cache row's latent part: its hook checks them */
    if ((vdim != hp->head_dim && hp->arch != ARCH_DEEPSEEK2) || hp->head_dim <= 0 || hp->head_dim % 2) {
        st_error_set("%s: unsupported head sizes (key %d, value %d)", gguf_path(L->f), hp->head_dim, vdim);
        return -1;
    }
    const arch_def *ad = &ARCHS[hp->arch];
    hp->n_ff = get_u32(L, "feed_forward_length", !ad->moe, 0);
    hp->rms_eps = get_f32(L, "attention.layer_norm_rms_epsilon", 1e-5f);
    hp->rope_theta = get_f32(L, "rope.freq_base", 10000.0f);
    hp->rope_theta_swa = hp->rope_theta;
    hp->rope_freq_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch);
    const char *s;
    uint64_t slen;
    if (gguf_get_str(L->f, key, &s, &slen) == 0 && slen == 6 && !memcmp(s, "linear", 6)) {
        float factor = get_f32(L, "rope.scaling.factor", 1.0f);
        if (factor > 0) hp->rope_freq_scale = 1.0f / factor;
    }
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->act = ad->act;
    hp->rope_neox = ad->rope_neox;
    hp->qkv_bias = ad->qkv_bias;
    hp->qk_norm = ad->qk_norm;
    hp->post_norms = ad->post_norms;
    hp->gate_fn = ST_GATE_SOFTMAX;
    hp->expert_scale = 1.0f;
    if (ad->moe && moe_hparams(L, hp) != 0) return -1;
    if (ad->extra && ad->extra(L, hp) != 0) return -1;
    return L->failed ? -1 : 0;
}

/* Layer il's rows of the tensor table (model_tensors.c) that the family has, into m->layers[il]. */
static void bind_layer(loader *L, model *m, int il) {
    const model_hparams *hp = &m->hp;
    char name[96];
    for (int t = 0; t < MODEL_N_LAYER_TENSORS && !L->failed; t++) {
        const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[t];
        if (!model_has_tensor(hp, il, lt->when)) continue;
        snprintf(name, sizeof name, "blk.%d.%s", il, lt->name);
        char *field = (char *)&m->layers[il] + lt->offset;
        if (lt->vec == 2) /* the bias of the weight bound by an earlier row */
            ((st_weight *)field)->bias =
                get_vec(L, m, name, model_dim_size(hp, lt->in), model_dim_size(hp, lt->out), 1);
        else if (lt->vec)
            *(const float **)field = get_vec(L, m, name, model_dim_size(hp, lt->in), model_dim_size(hp, lt->out), 1);
        else
            *(st_weight *)field = get_weight(L, name, model_dim_size(hp, lt->in), model_dim_size(hp, lt->out),
                                             model_dim_size(hp, lt->mat), 1);
    }
}

/* The first nextn (MTP) block, layer n_layer, as llama.cpp names its
 * tensors: the table's rows of the family's attention layer with experts
 * (the hybrids' gated attention, DeepSeek's latent attention, GLM-4.5's;
 * the loaders of these families alone set n_nextn), and nextn.eh_proj,
 * enorm, hnorm (required once eh_proj is there), the optional
 * nextn.shared_head_norm, shared_head_head and embed_tokens (else the
 * model's own). A file without nextn.eh_proj (converted without the MTP
 * head) loads as before, with m->mtp NULL; so does one whose block is
 * incomplete or misshapen, with a warning naming the tensor (the main pass
 * never reads the block, as llama.cpp skips it unless asked to draft). */
static void bind_mtp(loader *L0, model *m) {
    loader sub = *L0, *L = &sub; /* a failure here leaves the model's loader as it was */
    const model_hparams *hp = &m->hp;
    const int il = hp->n_layer;
    const int64_t E = hp->n_embd;
    char name[96];
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_EH_PROJ, il);
    if (hp->n_nextn < 1 || !hp->n_expert || !gguf_find_tensor(L->f, name)) return;
    model_mtp *mt = st_calloc(1, sizeof *mt);
    mt->eh_proj = get_weight(L, name, 2 * E, E, 1, 1);
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_ENORM, il);
    mt->enorm = get_vec(L, m, name, E, 1, 1);
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_HNORM, il);
    mt->hnorm = get_vec(L, m, name, E, 1, 1);
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_SHARED_HEAD_NORM, il);
    mt->head_norm = get_vec(L, m, name, E, 1, 0);
    if (!mt->head_norm) mt->head_norm = m->output_norm;
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_SHARED_HEAD_HEAD, il);
    mt->head = get_weight(L, name, E, hp->n_vocab, 1, 0);
    if (!mt->head.data) mt->head = m->output;
    snprintf(name, sizeof name, "blk.%d." HYBRID_T_NEXTN_EMBED_TOKENS, il);
    mt->embed = get_weight(L, name, E, hp->n_vocab, 1, 0);
    if (!mt->embed.data) mt->embed = m->tok_embd;
    bind_layer(L, m, il);
    if (L->failed) {
        ST_WARN("%s; the multi-token prediction block is not usable (--draft mtp)", st_error_get());
        memset(&m->layers[il], 0, sizeof m->layers[il]);
        st_free(mt);
        return;
    }
    m->mtp = mt;
}

model *model_load(const char *path) {
    gguf_file *f = gguf_open(path);
    if (!f) return NULL;
    const char *arch;
    uint64_t alen;
    if (gguf_get_str(f, "general.architecture", &arch, &alen) != 0) {
        st_error_set("%s: no general.architecture key: not a model file", path);
        gguf_close(f);
        return NULL;
    }
    int a = model_arch_from_name(arch, alen);
    if (a < 0) {
        st_error_set("%s: architecture '%.*s' is not supported (strata --families lists what is)", path,
                     (int)(alen > 64 ? 64 : alen), arch);
        gguf_close(f);
        return NULL;
    }
    model *m = st_calloc(1, sizeof *m);
    m->file = f;
    m->hp.arch = (model_arch)a;
    loader L = {f, ARCHS[a].name, 0};
    model_hparams *hp = &m->hp;
    if (load_hparams(&L, hp) != 0) goto fail;

    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd) {
        st_error_set("%s: missing or misshapen tensor 'token_embd.weight'", path);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    char name[96];
    const int64_t E = hp->n_embd;
    m->tok_embd = get_weight(&L, "token_embd.weight", E, hp->n_vocab, 1, 1);
    m->output_norm = get_vec(&L, m, "output_norm.weight", E, 1, 1);
    m->output = get_weight(&L, "output.weight", E, hp->n_vocab, 1, 0);
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    /* Llama 3.1+: per-pair divisors of the rotary frequencies (the llama3 rope scaling, baked in) */
    m->rope_freqs = get_vec(&L, m, "rope_freqs.weight", hp->head_dim / 2, 1, 0);
    snprintf(name, sizeof name, "%s.rope.scaling.type", L.arch);
    const char *rs;
    uint64_t rslen;
    if (hp->arch == ARCH_GPT_OSS && gguf_get_str(f, name, &rs, &rslen) == 0 && rslen == 4 && !memcmp(rs, "yarn", 4) &&
        yarn_hparams(&L, m) != 0)
        goto fail;
    /* deepseek2's YaRN (keys read by deepseek2_hparams): the rotated part's divisors, the range rounded
     * as DeepSeek's code and llama.cpp round it; forward_mla.c turns with them at frequency scale 1 */
    if (hp->arch == ARCH_DEEPSEEK2 && hp->yarn_orig_ctx > 0) {
        yarn_divisors(m, hp->n_rot, hp->yarn_orig_ctx, 1.0f / hp->rope_freq_scale, hp->yarn_beta_fast,
                      hp->yarn_beta_slow, 1.0f, 1);
        hp->rope_freq_scale = 1.0f;
    }

    m->layers = st_calloc((size_t)hp->n_layer + 1, sizeof(model_layer)); /* + the MTP block's */
    for (int il = 0; il < hp->n_layer && !L.failed; il++) bind_layer(&L, m, il);
    if (!L.failed) bind_mtp(&L, m);
    if (L.failed) goto fail;
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_keep_layers(model *m, int il0, int il1, int ends) {
    for (int il = 0; il < m->hp.n_layer; il++)
        if (il < il0 || il >= il1) memset(&m->layers[il], 0, sizeof m->layers[il]);
    if (ends) return;
    memset(&m->tok_embd, 0, sizeof m->tok_embd);
    memset(&m->output, 0, sizeof m->output);
    m->output_norm = NULL;
}

/* [*first, *end) of the layers whose pointer at byte `off` of model_layer
 * is bound; 0 (and nothing set) when no layer's is. */
static int bound_span(const model *m, size_t off, int *first, int *end) {
    int a = m->hp.n_layer, b = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const void *p;
        memcpy(&p, (const char *)&m->layers[il] + off, sizeof p);
        if (p) {
            if (il < a) a = il;
            b = il + 1;
        }
    }
    if (a >= b) return 0;
    *first = a, *end = b;
    return 1;
}

void model_routed_layers(const model *m, int *first, int *end) {
    if (!bound_span(m, offsetof(model_layer, ffn_gate_exps) + offsetof(st_weight, data), first, end))
        *first = m->hp.n_dense_lead, *end = m->hp.n_layer;
}

void model_bound_layers(const model *m, int *first, int *end) {
    if (!bound_span(m, offsetof(model_layer, attn_norm), first, end)) *first = 0, *end = m->hp.n_layer;
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) st_free(m->owned[i]);
    st_free(m->owned);
    st_free(m->mtp);
    st_free(m->layers);
    gguf_close(m->file);
    st_free(m);
}

/* Over the layers' matrices one token uses (a routed tensor: the
 * n_expert_used experts), the sum of their bytes, or of their multiply-adds
 * (rows x columns). */
static double layer_weights_per_token(const model *m, int macs) {
    const model_hparams *hp = &m->hp;
    double sum = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int t = 0; t < MODEL_N_LAYER_TENSORS; t++) {
            const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[t];
            if (lt->vec || !model_has_tensor(hp, il, lt->when)) continue;
            const st_weight *w = (const st_weight *)((const char *)&m->layers[il] + lt->offset);
            if (!w->data) continue;
            const double per = macs ? (double)w->n_in : (double)w->row_bytes;
            sum += per * (double)w->n_out * (lt->cls == MT_ROUTED ? (double)hp->n_expert_used : 1.0);
        }
    return sum;
}

double model_active_bytes_per_token(const model *m) {
    /* the output matrix, then the layers; the embedding is one row, not counted */
    return (double)m->output.row_bytes * (double)m->output.n_out + layer_weights_per_token(m, 0);
}

double model_layer_macs_per_token(const model *m) { return layer_weights_per_token(m, 1); }
