/* gpt-oss (gpt-oss-20b, gpt-oss-120b) as llama.cpp b11434 names it in GGUF
 * (LLM_ARCH_OPENAI_MOE, "gpt-oss"): the keys and tensors beyond qwen3moe's
 * (arch_qwen3moe_names.h, whose common keys and tensors it shares with
 * "qwen3moe." replaced by "gpt-oss."). Facts looked up in llama.cpp
 * (src/llama-arch.cpp for the names, src/models/openai-moe.cpp, which loads
 * them; src/llama-model.cpp for the rope and YaRN keys).
 *
 * Shapes in ggml's order (ne[0] contiguous); Q = n_head * head_dim, KV = n_head_kv * head_dim:
 *   attn_q.bias {Q}, attn_k.bias, attn_v.bias {KV}, attn_output.bias {n_embd}
 *   attn_sinks.weight {n_head}                          (one sink logit per query head)
 *   post_attention_norm {n_embd}                        (the pre-FFN norm)
 *   ffn_gate_inp.bias {n_expert}
 *   ffn_gate_exps.bias, ffn_up_exps.bias {n_ff_exp, n_expert}; ffn_down_exps.bias {n_embd, n_expert}
 * Keys: attention.sliding_window (required), rope.scaling.{type = "yarn", factor,
 * original_context_length}; the sliding layers are il % 2 == 0 unless
 * attention.sliding_window_pattern says otherwise.
 */
#ifndef STRATA_MODEL_ARCH_GPT_OSS_NAMES_H
#define STRATA_MODEL_ARCH_GPT_OSS_NAMES_H

#define GPT_OSS_ARCH              "gpt-oss"
#define GPT_OSS_KV_SLIDING_WINDOW "attention.sliding_window"
#define GPT_OSS_KV_ROPE_SCALING   "rope.scaling.type"
#define GPT_OSS_KV_ROPE_FACTOR    "rope.scaling.factor"
#define GPT_OSS_KV_ROPE_ORIG_CTX  "rope.scaling.original_context_length"

#define GPT_OSS_T_ATTN_OUT_BIAS  "attn_output.bias"
#define GPT_OSS_T_ATTN_SINKS     "attn_sinks.weight"
#define GPT_OSS_T_GATE_INP_BIAS  "ffn_gate_inp.bias"
#define GPT_OSS_T_GATE_EXPS_BIAS "ffn_gate_exps.bias"
#define GPT_OSS_T_UP_EXPS_BIAS   "ffn_up_exps.bias"
#define GPT_OSS_T_DOWN_EXPS_BIAS "ffn_down_exps.bias"

#endif
