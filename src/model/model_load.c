/* Loading a model: hyper-parameters from GGUF metadata (keys prefixed by the
 * architecture name, as llama.cpp writes them), then every tensor bound by
 * name and checked for type and shape, so that a wrong or truncated file is
 * refused at load with a message naming the tensor, never mid-forward.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "quant/quant.h"

static const char *ARCH_NAMES[ARCH_COUNT] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma3"};

const char *model_arch_name(model_arch a) { return (a >= 0 && a < ARCH_COUNT) ? ARCH_NAMES[a] : "?"; }

int model_arch_from_name(const char *name, uint64_t len) {
    for (int i = 0; i < ARCH_COUNT; i++)
        if (strlen(ARCH_NAMES[i]) == len && !memcmp(ARCH_NAMES[i], name, len)) return i;
    return -1;
}

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
static st_weight get_weight(loader *L, const char *name, int64_t n_in, int64_t n_out, int64_t n_mat,
                            int required) {
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
            st_error_set("%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                         gguf_path(L->f), name, (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1),
                         (long long)(t->n_dims > 2 ? t->ne[2] : 1), (long long)n_in, (long long)n_out,
                         (long long)n_mat);
            L->failed = 1;
            return w;
        }
    }
    if (!qt_get(t->type) || !qt_get(t->type)->dequant) {
        st_error_set("%s: tensor '%s' has type %d, which Strata cannot compute with", gguf_path(L->f), name,
                     t->type);
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

/* A 1-D f32 vector (norm weight, bias); converted to f32 if stored otherwise. */
static const float *get_vec(loader *L, model *m, const char *name, int64_t n, int required) {
    st_weight w = get_weight(L, name, n, 1, 1, required);
    if (!w.data) return NULL;
    if (w.type == QT_F32) return (const float *)w.data;
    float *copy = st_malloc((size_t)n * sizeof(float));
    qt_dequantize(w.type, w.data, copy, n);
    m->owned = st_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(float *));
    m->owned[m->n_owned++] = copy;
    return copy;
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
        st_error_set("%s: inconsistent hyper-parameters (layers %d, embd %d, heads %d/%d, ctx %d)",
                     gguf_path(L->f), hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ctx_train);
        return -1;
    }
    hp->head_dim = get_u32(L, "attention.key_length", 0, (uint32_t)(hp->n_embd / hp->n_head));
    int vdim = get_u32(L, "attention.value_length", 0, (uint32_t)hp->head_dim);
    if (vdim != hp->head_dim || hp->head_dim <= 0 || hp->head_dim % 2) {
        st_error_set("%s: unsupported head sizes (key %d, value %d)", gguf_path(L->f), hp->head_dim, vdim);
        return -1;
    }
    hp->n_ff = get_u32(L, "feed_forward_length", hp->arch != ARCH_QWEN3MOE, 0);
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
    hp->act = ST_ACT_SILU;
    hp->rope_neox = hp->arch != ARCH_LLAMA;
    hp->qkv_bias = hp->arch == ARCH_QWEN2;
    hp->qk_norm = hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN3MOE || hp->arch == ARCH_GEMMA3;
    if (hp->arch == ARCH_QWEN3MOE) {
        hp->n_expert = get_u32(L, "expert_count", 1, 0);
        hp->n_expert_used = get_u32(L, "expert_used_count", 1, 0);
        hp->n_ff_exp = get_u32(L, "expert_feed_forward_length", 1, 0);
        hp->norm_topk = 1; /* Qwen3-MoE renormalises its top-k weights (norm_topk_prob) */
        int normw;
        snprintf(key, sizeof key, "%s.expert_weights_norm", L->arch);
        if (gguf_get_bool(L->f, key, &normw) == 0) hp->norm_topk = normw;
        if (L->failed) return -1;
        if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp <= 0) {
            st_error_set("%s: inconsistent MoE hyper-parameters (experts %d, used %d, ff %d)", gguf_path(L->f),
                         hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
            return -1;
        }
    }
    if (hp->arch == ARCH_GEMMA3) {
        hp->post_norms = 1;
        hp->act = ST_ACT_GELU;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->n_swa = get_u32(L, "attention.sliding_window", 1, 0);
        hp->swa_pattern = 6; /* five local layers, then one global (Gemma 3) */
        hp->rope_theta_swa = 10000.0f;
        /* Gemma 3 27B scales q.k by 1/sqrt(n_embd / n_head) (its query_pre_attn_scalar 168 = 5376 / 32),
         * the others by 1/sqrt(head_dim); GGUF does not store the scalar, so the 27B is known by its
         * 62 layers, as llama.cpp does */
        if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)hp->n_embd / (float)hp->n_head);
    }
    return L->failed ? -1 : 0;
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
    loader L = {f, ARCH_NAMES[a], 0};
    model_hparams *hp = &m->hp;
    if (load_hparams(&L, hp) != 0) goto fail;

    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd) {
        st_error_set("%s: missing or misshapen tensor 'token_embd.weight'", path);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim;
    m->tok_embd = get_weight(&L, "token_embd.weight", E, hp->n_vocab, 1, 1);
    m->output_norm = get_vec(&L, m, "output_norm.weight", E, 1);
    m->output = get_weight(&L, "output.weight", E, hp->n_vocab, 1, 0);
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    /* Llama 3.1+: per-pair divisors of the rotary frequencies (the llama3 rope scaling, baked in) */
    m->rope_freqs = get_vec(&L, m, "rope_freqs.weight", hp->head_dim / 2, 0);

    m->layers = st_calloc((size_t)hp->n_layer, sizeof(model_layer));
    char name[96];
#define TN(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    for (int il = 0; il < hp->n_layer && !L.failed; il++) {
        model_layer *l = &m->layers[il];
        l->attn_norm = get_vec(&L, m, TN("attn_norm.weight"), E, 1);
        l->wq = get_weight(&L, TN("attn_q.weight"), E, Q, 1, 1);
        l->wk = get_weight(&L, TN("attn_k.weight"), E, KV, 1, 1);
        l->wv = get_weight(&L, TN("attn_v.weight"), E, KV, 1, 1);
        l->wo = get_weight(&L, TN("attn_output.weight"), Q, E, 1, 1);
        if (hp->qkv_bias) {
            l->bq = get_vec(&L, m, TN("attn_q.bias"), Q, 1);
            l->bk = get_vec(&L, m, TN("attn_k.bias"), KV, 1);
            l->bv = get_vec(&L, m, TN("attn_v.bias"), KV, 1);
        }
        if (hp->qk_norm) {
            l->q_norm = get_vec(&L, m, TN("attn_q_norm.weight"), hp->head_dim, 1);
            l->k_norm = get_vec(&L, m, TN("attn_k_norm.weight"), hp->head_dim, 1);
        }
        if (hp->post_norms) {
            l->post_attn_norm = get_vec(&L, m, TN("post_attention_norm.weight"), E, 1);
            l->post_ffn_norm = get_vec(&L, m, TN("post_ffw_norm.weight"), E, 1);
        }
        l->ffn_norm = get_vec(&L, m, TN("ffn_norm.weight"), E, 1);
        if (hp->n_expert) {
            l->ffn_gate_inp = get_weight(&L, TN("ffn_gate_inp.weight"), E, hp->n_expert, 1, 1);
            l->ffn_gate_exps = get_weight(&L, TN("ffn_gate_exps.weight"), E, hp->n_ff_exp, hp->n_expert, 1);
            l->ffn_up_exps = get_weight(&L, TN("ffn_up_exps.weight"), E, hp->n_ff_exp, hp->n_expert, 1);
            l->ffn_down_exps = get_weight(&L, TN("ffn_down_exps.weight"), hp->n_ff_exp, E, hp->n_expert, 1);
        } else {
            l->ffn_gate = get_weight(&L, TN("ffn_gate.weight"), E, hp->n_ff, 1, 1);
            l->ffn_up = get_weight(&L, TN("ffn_up.weight"), E, hp->n_ff, 1, 1);
            l->ffn_down = get_weight(&L, TN("ffn_down.weight"), hp->n_ff, E, 1, 1);
        }
    }
#undef TN
    if (L.failed) goto fail;
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) st_free(m->owned[i]);
    st_free(m->owned);
    st_free(m->layers);
    gguf_close(m->file);
    st_free(m);
}

double model_active_bytes_per_token(const model *m) {
    const model_hparams *hp = &m->hp;
    double b = (double)m->output.row_bytes * (double)m->output.n_out;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *l = &m->layers[il];
        const st_weight *dense[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                                    &l->ffn_gate_inp};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++)
            if (dense[i]->data) b += (double)dense[i]->row_bytes * (double)dense[i]->n_out;
        const st_weight *exps[] = {&l->ffn_gate_exps, &l->ffn_up_exps, &l->ffn_down_exps};
        for (size_t i = 0; i < 3; i++)
            if (exps[i]->data)
                b += (double)exps[i]->row_bytes * (double)exps[i]->n_out * (double)hp->n_expert_used;
    }
    return b;
}
