#!/usr/bin/env bash
# compare_offload.sh: experts beyond VRAM (issue 15), Strata against
# llama.cpp (and ik_llama.cpp when given) on one GGUF, back to back in one run:
#   all routed experts in host RAM   Strata --expert-cache 0     peers --n-cpu-moe L (every layer)
#   half of the experts on the GPU   Strata --expert-cache L*X/2 peers --n-cpu-moe L/2
# each as decode tg64 and prompt pp512. Prints each figure, the ratio to the
# better peer, and for Strata the bytes each lane moved per decoded token
# with the limit they imply.
#
# usage: bench/compare_offload.sh STRATA_BIN MODEL [LLAMA_BENCH [IK_LLAMA_BENCH]]
# env: REPS (3), THREADS (the peers' -t; Strata's default is every core it may
#      use), HOST_GBS (135: the host read bandwidth bench_matvec measures on the
#      H200 machine's 16 threads), PCIE_GBS (55: pinned host-to-device),
#      IK_ARGS (ik_llama.cpp's own flags, default "-fmoe 1"; DeepSeek-class
#      files: "-fmoe 1 -mla 3"), STRATA_ARGS (added to every strata bench).
#
# Half the experts: Strata caches the same number of experts as the peers keep
# on the GPU (the peers keep whole layers; Strata spreads the slots over every
# layer) and adds one layer's experts of streaming buffer; Strata's start log
# prints its whole plan.
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
S=$1
M=$2
L1=${3:-}
L2=${4:-}
R=${REPS:-3}
HOST=${HOST_GBS:-135}
PCIE=${PCIE_GBS:-55}
T=${THREADS:-$(nproc)}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/card: /'
echo "model: $M ($(du -h "$M" | cut -f1)); host: $(nproc) cores, peers -t $T"
INFO=$("$S" info "$M" 2>/dev/null)
NL=$(echo "$INFO" | grep -oE 'block_count +u32 +[0-9]+' | grep -oE '[0-9]+$')
NX=$(echo "$INFO" | grep -oE 'expert_count +u32 +[0-9]+' | grep -oE '[0-9]+$')
echo "layers $NL, experts $NX per layer"

num() { grep -oE "$1[^:]*: [0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }
sb() { "$S" bench -m "$M" --gpu 0 -r "$R" ${STRATA_ARGS:-} "$@" 2>&1 | tee -a /tmp/strata_offload.log; }
lb() {
    local bin=$1
    shift
    "$bin" -m "$M" -ngl 99 -fa 1 -r "$R" -t "$T" -o csv "$@" 2>/dev/null | awk -F, '
        index($0, "avg_ts") { for (i = 1; i <= NF; i++) { f = $i; gsub(/"/, "", f); if (f == "avg_ts") c = i }; next }
        c { v = $c; gsub(/"/, "", v); print v }' | tail -1
}

declare -A ST P1 P2
for w in all half; do
    if [ $w = all ]; then cache=0; ncmoe=$NL; else cache=$((NL * NX / 2)); ncmoe=$((NL / 2)); fi
    echo "== $w: strata --expert-cache $cache, peers --n-cpu-moe $ncmoe"
    out=$(sb -p 512 -n 64 --expert-cache $cache)
    echo "$out" | grep -E "memory plan|expert lanes|experts in decode|pp512|tg64" | sed 's/^/  /'
    ST[${w}_pp512]=$(echo "$out" | num pp512)
    ST[${w}_tg64]=$(echo "$out" | num tg64)
    cpu_mb=$(echo "$out" | grep -oE 'CPU lane read [0-9.]+ MB' | grep -oE '[0-9.]+')
    pcie_mb=$(echo "$out" | grep -oE 'PCIe moved [0-9.]+ MB' | grep -oE '[0-9.]+')
    [ -n "$cpu_mb" ] && awk -v c="$cpu_mb" -v p="${pcie_mb:-0}" -v h="$HOST" -v q="$PCIE" -v t="${ST[${w}_tg64]}" 'BEGIN {
        lim = 1 / (c / 1000 / h + 0);
        if (p > 0) { l2 = 1 / (p / 1000 / q); if (l2 < lim) lim = l2 }
        printf "  limit: %.1f MB/token on the CPU lane at %d GB/s (+ %.1f MB over PCIe at %d GB/s) -> %.0f tok/s; measured %.1f = %.0f%% of it\n", c, h, p, q, lim, t, 100 * t / lim }'
    if [ -n "$L1" ]; then
        P1[${w}_pp512]=$(lb "$L1" -p 512 -n 0 -ncmoe $ncmoe)
        P1[${w}_tg64]=$(lb "$L1" -p 0 -n 64 -ncmoe $ncmoe)
    fi
    if [ -n "$L2" ]; then
        P2[${w}_pp512]=$(lb "$L2" -p 512 -n 0 -ncmoe $ncmoe ${IK_ARGS:--fmoe 1})
        P2[${w}_tg64]=$(lb "$L2" -p 0 -n 64 -ncmoe $ncmoe ${IK_ARGS:--fmoe 1})
    fi
done
[ -n "$L1" ] && "$L1" --version 2>&1 | head -2 | sed 's/^/llama.cpp: /'

printf '\n| workload | test | strata | llama.cpp | ik_llama.cpp | strata / better peer |\n|---|---|---|---|---|---|\n'
for w in all half; do
    for t in tg64 pp512; do
        s=${ST[${w}_$t]:-}; a=${P1[${w}_$t]:-}; b=${P2[${w}_$t]:-}
        best=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { print (a > b ? a : b) }')
        r=""
        [ -n "$s" ] && awk -v x="$best" 'BEGIN { exit !(x > 0) }' && r=$(awk -v s="$s" -v x="$best" 'BEGIN { printf "%.2fx", s / x }')
        printf '| %s | %s | %s | %s | %s | %s |\n' "$w" "$t" "${s:--}" "${a:--}" "${b:--}" "${r:--}"
    done
done
exit 0
