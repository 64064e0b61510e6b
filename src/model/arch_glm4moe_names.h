/* glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6) as llama.cpp b11434 names it in
 * GGUF: the keys and tensors beyond qwen3moe's (arch_qwen3moe_names.h, whose
 * common keys and tensors it shares, with "qwen3moe." replaced by
 * "glm4moe."). Facts looked up in llama.cpp (src/llama-arch.cpp for the
 * names, src/models/glm4-moe.cpp, which loads them).
 *
 * Shapes in ggml's order (ne[0] contiguous); Q = n_head * head_dim, KV = n_head_kv * head_dim:
 *   attn_q.bias {Q}, attn_k.bias, attn_v.bias {KV}      (optional in llama.cpp; GLM-4.5 has them)
 *   attn_q_norm, attn_k_norm {head_dim}                (optional; GLM-4.5-Air has none)
 *   post_attention_norm {n_embd}                       (the pre-FFN norm)
 *   dense layers (il < leading_dense_block_count): ffn_gate, ffn_up {n_embd, n_ff}; ffn_down {n_ff, n_embd}
 *   MoE layers: ffn_gate_inp {n_embd, n_expert}; exp_probs_b.bias {n_expert};
 *               the experts as qwen3moe's; ffn_{gate,up}_shexp {n_embd, n_ff_exp * n_shared},
 *               ffn_down_shexp {n_ff_exp * n_shared, n_embd}  (no shared-expert gate)
 *   NextN/MTP layers (the last nextn_predict_layers of block_count): a whole layer plus
 *               nextn.{eh_proj, enorm, hnorm, embed_tokens, shared_head_head, shared_head_norm}
 */
#ifndef STRATA_MODEL_ARCH_GLM4MOE_NAMES_H
#define STRATA_MODEL_ARCH_GLM4MOE_NAMES_H

#define GLM4MOE_ARCH                  "glm4moe"
#define GLM4MOE_KV_LEADING_DENSE      "leading_dense_block_count"
#define GLM4MOE_KV_EXPERT_SHARED      "expert_shared_count"
#define GLM4MOE_KV_EXPERT_SCALE       "expert_weights_scale"
#define GLM4MOE_KV_EXPERT_NORM        "expert_weights_norm" /* bool */
#define GLM4MOE_KV_EXPERT_GATING_FUNC "expert_gating_func"  /* 1 softmax, 2 sigmoid */
#define GLM4MOE_KV_ROPE_DIMS          "rope.dimension_count"
#define GLM4MOE_KV_NEXTN              "nextn_predict_layers"

#define GLM4MOE_T_ATTN_Q_BIAS "attn_q.bias"
#define GLM4MOE_T_ATTN_K_BIAS "attn_k.bias"
#define GLM4MOE_T_ATTN_V_BIAS "attn_v.bias"
#define GLM4MOE_T_EXP_PROBS_B "exp_probs_b.bias"
#define GLM4MOE_T_FFN_GATE    "ffn_gate.weight"
#define GLM4MOE_T_FFN_UP      "ffn_up.weight"
#define GLM4MOE_T_FFN_DOWN    "ffn_down.weight"

#endif
