/* deepseek2 (DeepSeek-V2/V2-Lite/V3/R1, Kimi K2) as llama.cpp b11434 names it
 * in GGUF: the keys and tensors beyond qwen3moe's (arch_qwen3moe_names.h,
 * whose common keys it shares with "deepseek2." in front) and glm4moe's
 * (arch_glm4moe_names.h: leading dense layers, shared experts, the selection
 * bias, the gating function). Facts looked up in llama.cpp b11434
 * (src/llama-arch.cpp for the names, src/models/deepseek2.cpp, which loads
 * them, src/llama-context.cpp for the YaRN factors).
 *
 * The converter writes the MLA form: the KV cache is one head
 * (head_count_kv = 1) of key_length = kv_lora_rank + rope dims, value_length
 * = kv_lora_rank; the real query/key and value head sizes are key_length_mla
 * (qk_nope + qk_rope) and value_length_mla. yarn_log_multiplier is stored as
 * 0.1 * mscale_all_dim.
 *
 * Shapes in ggml's order (ne[0] contiguous); nope = key_length_mla - rope dims:
 *   attn_q_a {n_embd, q_lora}, attn_q_a_norm {q_lora}, attn_q_b {q_lora, n_head * key_length_mla}
 *     or attn_q {n_embd, n_head * key_length_mla} when q_lora_rank is absent (V2-Lite)
 *   attn_kv_a_mqa {n_embd, kv_lora + rope}: the latent, then the shared rope key
 *   attn_kv_a_norm {kv_lora}
 *   attn_k_b {nope, kv_lora, n_head}, attn_v_b {kv_lora, value_length_mla, n_head}
 *   attn_output {n_head * value_length_mla, n_embd}; ffn_norm {n_embd}
 *   dense layers: ffn_gate, ffn_up {n_embd, n_ff}, ffn_down {n_ff, n_embd}
 *   MoE layers: ffn_gate_inp, exp_probs_b.bias (optional: V3 has it, V2 not), the experts,
 *               ffn_{gate,up}_shexp {n_embd, n_ff_exp * n_shared}, ffn_down_shexp
 *   the last nextn_predict_layers of block_count: the MTP layer (nextn.*), not run
 */
#ifndef STRATA_MODEL_ARCH_DEEPSEEK2_NAMES_H
#define STRATA_MODEL_ARCH_DEEPSEEK2_NAMES_H

#define DEEPSEEK2_ARCH                "deepseek2"
#define DEEPSEEK2_KV_Q_LORA           "attention.q_lora_rank"
#define DEEPSEEK2_KV_KV_LORA          "attention.kv_lora_rank"
#define DEEPSEEK2_KV_KEY_LENGTH_MLA   "attention.key_length_mla"
#define DEEPSEEK2_KV_VALUE_LENGTH_MLA "attention.value_length_mla"
#define DEEPSEEK2_KV_GROUP_COUNT      "expert_group_count"
#define DEEPSEEK2_KV_GROUP_USED       "expert_group_used_count"
#define DEEPSEEK2_KV_ROPE_SCALING     "rope.scaling.type" /* "yarn" */
#define DEEPSEEK2_KV_ROPE_FACTOR      "rope.scaling.factor"
#define DEEPSEEK2_KV_ROPE_ORIG_CTX    "rope.scaling.original_context_length"
#define DEEPSEEK2_KV_YARN_LOG_MUL     "rope.scaling.yarn_log_multiplier" /* 0.1 * mscale_all_dim */
#define DEEPSEEK2_KV_YARN_BETA_FAST   "rope.scaling.yarn_beta_fast"
#define DEEPSEEK2_KV_YARN_BETA_SLOW   "rope.scaling.yarn_beta_slow"

#define DEEPSEEK2_T_ATTN_Q_A       "attn_q_a.weight"
#define DEEPSEEK2_T_ATTN_Q_A_NORM  "attn_q_a_norm.weight"
#define DEEPSEEK2_T_ATTN_Q_B       "attn_q_b.weight"
#define DEEPSEEK2_T_ATTN_KV_A_MQA  "attn_kv_a_mqa.weight"
#define DEEPSEEK2_T_ATTN_KV_A_NORM "attn_kv_a_norm.weight"
#define DEEPSEEK2_T_ATTN_K_B       "attn_k_b.weight"
#define DEEPSEEK2_T_ATTN_V_B       "attn_v_b.weight"
#define DEEPSEEK2_T_ATTN_KV_B      "attn_kv_b.weight" /* the legacy unsplit form: refused */

#endif
