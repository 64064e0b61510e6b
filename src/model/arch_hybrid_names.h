/* qwen35moe and qwen3next (the gated DeltaNet hybrids) as llama.cpp names
 * them in GGUF: the keys and tensors beyond qwen3moe's (arch_qwen3moe_names.h,
 * whose common keys and tensors they share, with "qwen3moe." replaced by
 * their own prefix). Facts looked up in llama.cpp (src/llama-arch.cpp,
 * src/models/qwen35moe.cpp and qwen3next.cpp, which load them).
 *
 * Shapes in ggml's order (ne[0] contiguous); conv = 2*n_k*d + n_v*d, value = n_v*d:
 *   attn_q (attention layers)  {n_embd, 2 * head_dim * n_head}: per head, query then gate rows
 *   attn_qkv                   {n_embd, conv}
 *   attn_gate                  {n_embd, value}
 *   ssm_beta, ssm_alpha        {n_embd, n_v}          (qwen35moe)
 *   ssm_ba                     {n_embd, 2 * n_v}      (qwen3next)
 *   ssm_conv1d                 {d_conv, conv}
 *   ssm_dt.bias, ssm_a         {n_v}                  (ssm_a = -exp(A_log), no ".weight")
 *   ssm_norm                   {d}
 *   ssm_out                    {value, n_embd}
 *   post_attention_norm        {n_embd}               (the pre-FFN norm)
 *   ffn_gate_inp_shexp         {n_embd}
 *   ffn_gate_shexp, ffn_up_shexp {n_embd, n_ff_shexp};  ffn_down_shexp {n_ff_shexp, n_embd}
 * The multi-token prediction (MTP) block, blk.{n_layer} (block_count counts it,
 * nextn_predict_layers says how many): a gated attention layer's tensors with
 * experts, and
 *   nextn.eh_proj              {2 * n_embd, n_embd}   (input: [enorm(embedding) ; hnorm(hidden)])
 *   nextn.enorm, nextn.hnorm   {n_embd}
 *   nextn.shared_head_norm     {n_embd}               (optional: else output_norm)
 *   nextn.shared_head_head, nextn.embed_tokens {n_embd, n_vocab} (optional: else output, token_embd)
 */
#ifndef STRATA_MODEL_ARCH_HYBRID_NAMES_H
#define STRATA_MODEL_ARCH_HYBRID_NAMES_H

#define HYBRID_KV_FULL_ATTN_INTERVAL "full_attention_interval"
#define HYBRID_KV_ROPE_DIMS          "rope.dimension_count"
#define HYBRID_KV_ROPE_SECTIONS      "rope.dimension_sections"
#define HYBRID_KV_SSM_CONV_KERNEL    "ssm.conv_kernel"
#define HYBRID_KV_SSM_INNER_SIZE     "ssm.inner_size"
#define HYBRID_KV_SSM_STATE_SIZE     "ssm.state_size"
#define HYBRID_KV_SSM_TIME_STEP_RANK "ssm.time_step_rank" /* value heads */
#define HYBRID_KV_SSM_GROUP_COUNT    "ssm.group_count"    /* key heads */
#define HYBRID_KV_SHEXP_FF_LENGTH    "expert_shared_feed_forward_length"

#define HYBRID_T_POST_ATTN_NORM     "post_attention_norm.weight"
#define HYBRID_T_ATTN_QKV           "attn_qkv.weight"
#define HYBRID_T_ATTN_GATE          "attn_gate.weight"
#define HYBRID_T_SSM_BETA           "ssm_beta.weight"
#define HYBRID_T_SSM_ALPHA          "ssm_alpha.weight"
#define HYBRID_T_SSM_BA             "ssm_ba.weight"
#define HYBRID_T_SSM_CONV1D         "ssm_conv1d.weight"
#define HYBRID_T_SSM_DT             "ssm_dt.bias"
#define HYBRID_T_SSM_A              "ssm_a"
#define HYBRID_T_SSM_NORM           "ssm_norm.weight"
#define HYBRID_T_SSM_OUT            "ssm_out.weight"
#define HYBRID_T_FFN_GATE_INP_SHEXP "ffn_gate_inp_shexp.weight"
#define HYBRID_T_FFN_GATE_SHEXP     "ffn_gate_shexp.weight"
#define HYBRID_T_FFN_UP_SHEXP       "ffn_up_shexp.weight"
#define HYBRID_T_FFN_DOWN_SHEXP     "ffn_down_shexp.weight"

#define HYBRID_KV_NEXTN                 "nextn_predict_layers"
#define HYBRID_T_NEXTN_EH_PROJ          "nextn.eh_proj.weight"
#define HYBRID_T_NEXTN_ENORM            "nextn.enorm.weight"
#define HYBRID_T_NEXTN_HNORM            "nextn.hnorm.weight"
#define HYBRID_T_NEXTN_SHARED_HEAD_NORM "nextn.shared_head_norm.weight"
#define HYBRID_T_NEXTN_SHARED_HEAD_HEAD "nextn.shared_head_head.weight"
#define HYBRID_T_NEXTN_EMBED_TOKENS     "nextn.embed_tokens.weight"

#endif
