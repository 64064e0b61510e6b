#!/usr/bin/env bash
# attn_gpu.sh: the CUDA prompt attention op alone (bench_attn --gpu) over the
# head shapes of the models Strata runs, a 512-token chunk at positions 0..
# and 3584.., f16 and int8 caches; beside each, the same op with
# STRATA_CUDA_ATTN=gqa (the scalar kernels), so a tensor-core kernel's gain
# and its share of the card's f16 peak read off one table.
#
# usage: bench/attn_gpu.sh [BENCH_ATTN_BIN] [GPU]
# env: REPS (9), PROMPT (512), AT ("0 3584"), KV ("f16 int8")
set -euo pipefail
B=${1:-build/bin/bench_attn}
G=${2:-0}
R=${REPS:-9}
P=${PROMPT:-512}
# name query-heads kv-heads head-dim
SHAPES="glm-4.5-air:96:8:128 qwen3-30b-a3b:32:4:128 gpt-oss:64:8:64 qwen3.5-full-attn:16:2:256 gemma-3-4b:8:4:256"
run() { "$B" --gpu "$G" --depth 0 --prompt "$P" --reps "$R" "$@" 2>&1 | tail -1 | grep -oE '[0-9.]+ ms|\([0-9.]+%' | tr '\n' ' '; }
printf "| heads | kv | at | tensor cores | scalar (gqa) |\n|---|---|---:|---|---|\n"
for s in $SHAPES; do
    IFS=: read -r name h k d <<< "$s"
    for kv in ${KV:-f16 int8}; do
        for at in ${AT:-0 3584}; do
            a=(--heads "$h" --kv-heads "$k" --head-dim "$d" --kv "$kv" --at "$at")
            printf "| %s %s/%s x %s | %s | %s | %s | %s |\n" "$name" "$h" "$k" "$d" "$kv" "$at" \
                "$(STRATA_CUDA_ATTN=tc run "${a[@]}")" "$(STRATA_CUDA_ATTN=gqa run "${a[@]}")"
        done
    done
done
