/* qwen3moe as llama.cpp names it in GGUF: metadata keys and tensor names.
 *
 * These are facts of the file format, looked up in llama.cpp (src/llama-arch.cpp,
 * the qwen3moe loader in src/llama-model.cpp) and in the gguf package
 * (constants.py, MODEL_TENSORS[QWEN3MOE]). `strata synth` writes exactly these,
 * so a synthetic file loads in llama.cpp as a real Qwen3-MoE checkpoint would.
 *
 * Shapes use ggml's order: ne[0] is the contiguous (row) dimension.
 *   token_embd      {n_embd, n_vocab}
 *   output          {n_embd, n_vocab}            (optional in llama.cpp: tied if absent)
 *   attn_q          {n_embd, head_dim * n_head}
 *   attn_k, attn_v  {n_embd, head_dim * n_head_kv}
 *   attn_output     {head_dim * n_head, n_embd}
 *   attn_q_norm, attn_k_norm {head_dim}
 *   ffn_gate_inp    {n_embd, n_expert}           (the router)
 *   ffn_gate_exps, ffn_up_exps {n_embd, n_ff_exp, n_expert}
 *   ffn_down_exps   {n_ff_exp, n_embd, n_expert}
 */
#ifndef STRATA_MODEL_ARCH_QWEN3MOE_NAMES_H
#define STRATA_MODEL_ARCH_QWEN3MOE_NAMES_H

#define QWEN3MOE_ARCH "qwen3moe"

/* Hyper-parameter keys, each prefixed with "qwen3moe." in the file. */
#define QWEN3MOE_KV_BLOCK_COUNT         "block_count"
#define QWEN3MOE_KV_CONTEXT_LENGTH      "context_length"
#define QWEN3MOE_KV_EMBEDDING_LENGTH    "embedding_length"
#define QWEN3MOE_KV_FEED_FORWARD_LENGTH "feed_forward_length"
#define QWEN3MOE_KV_HEAD_COUNT          "attention.head_count"
#define QWEN3MOE_KV_HEAD_COUNT_KV       "attention.head_count_kv"
#define QWEN3MOE_KV_KEY_LENGTH          "attention.key_length"
#define QWEN3MOE_KV_VALUE_LENGTH        "attention.value_length"
#define QWEN3MOE_KV_ROPE_FREQ_BASE      "rope.freq_base"
#define QWEN3MOE_KV_RMS_EPS             "attention.layer_norm_rms_epsilon"
#define QWEN3MOE_KV_EXPERT_COUNT        "expert_count"
#define QWEN3MOE_KV_EXPERT_USED_COUNT   "expert_used_count"
#define QWEN3MOE_KV_EXPERT_FF_LENGTH    "expert_feed_forward_length"

/* Global tensors. */
#define QWEN3MOE_T_TOKEN_EMBD  "token_embd.weight"
#define QWEN3MOE_T_OUTPUT_NORM "output_norm.weight"
#define QWEN3MOE_T_OUTPUT      "output.weight"

/* Per-layer tensors: "blk.%d." followed by one of these. */
#define QWEN3MOE_T_ATTN_NORM     "attn_norm.weight"
#define QWEN3MOE_T_ATTN_Q        "attn_q.weight"
#define QWEN3MOE_T_ATTN_K        "attn_k.weight"
#define QWEN3MOE_T_ATTN_V        "attn_v.weight"
#define QWEN3MOE_T_ATTN_OUT      "attn_output.weight"
#define QWEN3MOE_T_ATTN_Q_NORM   "attn_q_norm.weight"
#define QWEN3MOE_T_ATTN_K_NORM   "attn_k_norm.weight"
#define QWEN3MOE_T_FFN_NORM      "ffn_norm.weight"
#define QWEN3MOE_T_FFN_GATE_INP  "ffn_gate_inp.weight"
#define QWEN3MOE_T_FFN_GATE_EXPS "ffn_gate_exps.weight"
#define QWEN3MOE_T_FFN_UP_EXPS   "ffn_up_exps.weight"
#define QWEN3MOE_T_FFN_DOWN_EXPS "ffn_down_exps.weight"

#endif
