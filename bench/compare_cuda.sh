#!/usr/bin/env bash
# compare_cuda.sh: the GPU benchmark of issue 4, Strata and llama.cpp on one
# GGUF file, back to back in one run: prompt pp512 and pp4096, decode tg128,
# and decode at a depth of 16K cached tokens with f16 and int8 (llama.cpp:
# q8_0) KV. Prints each figure, the ratio Strata/llama.cpp, the weights read
# per decoded token as GB/s, and that as a share of the HBM roofline.
#
# usage: bench/compare_cuda.sh STRATA_BIN MODEL [LLAMA_BENCH_BIN]
#   STRATA_BIN       the `strata` binary of a CUDA build (runs `strata bench --gpu 0`)
#   MODEL            GGUF file both load (e.g. `strata synth --preset qwen3-30b-a3b`)
#   LLAMA_BENCH_BIN  an already built llama-bench with CUDA (this script builds
#                    nothing); without it only Strata's figures are printed
# env: HBM_GBS (default 4300: device-to-device copy rate measured on the
#      H200 here, read+write counted) is the roofline's bandwidth; REPS (3);
#      DEPTH (16384; 0: only pp512, pp4096 and tg128, on both sides).
#
# Both sides use random prompt tokens and llama-bench's conventions: tg from an
# empty cache (or from the depth), pp timed over the whole prompt. llama.cpp
# runs with -ngl 99 -fa 1 (every layer on the GPU, flash attention).
set -uo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
S=$1
M=$2
L=${3:-}
R=${REPS:-3}
D=${DEPTH:-16384}
HBM=${HBM_GBS:-4300}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/card: /'
echo "model: $M ($(du -h "$M" | cut -f1))"

# strata bench prints "pp512: X tok/s" and "tg128: X tok/s, Y GB/s of weights"
sb() { "$S" bench -m "$M" --gpu 0 -r "$R" "$@" 2>&1 | tee -a /tmp/strata_bench.log; }
num() { grep -oE "$1[^:]*: [0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }
gbs() { grep -oE '[0-9.]+ GB/s' | head -1 | grep -oE '^[0-9.]+'; }

declare -A ST LL
out=$(sb -p 512 -n 128); ST[pp512]=$(echo "$out" | num pp512); ST[tg128]=$(echo "$out" | num tg128)
GB=$(echo "$out" | gbs)
ST[pp4096]=$(sb -p 4096 -n 0 | num pp4096)
if [ "$D" != 0 ]; then
    ST[tg128_nograph]=$(STRATA_CUDA_GRAPH=0 sb -p 0 -n 128 | num tg128)
    ST[tg64_d_f16]=$(sb -p 0 -n 64 -d "$D" --kv f16 | num tg64)
    ST[tg64_d_int8]=$(sb -p 0 -n 64 -d "$D" --kv int8 | num tg64)
fi

if [ -n "$L" ]; then
    # llama-bench csv: the column named avg_ts (quoted or not) is the mean tok/s;
    # lines before the header (device banners) are skipped
    lb() {
        "$L" -m "$M" -ngl 99 -fa 1 -r "$R" -o csv "$@" 2>/dev/null | awk -F, '
            index($0, "avg_ts") { for (i = 1; i <= NF; i++) { f = $i; gsub(/"/, "", f); if (f == "avg_ts") c = i }; next }
            c { v = $c; gsub(/"/, "", v); print v }' | tail -1
    }
    LL[pp512]=$(lb -p 512 -n 0)
    LL[pp4096]=$(lb -p 4096 -n 0)
    LL[tg128]=$(lb -p 0 -n 128)
    if [ "$D" != 0 ]; then
        LL[tg64_d_f16]=$(lb -p 0 -n 64 -d "$D")
        LL[tg64_d_int8]=$(lb -p 0 -n 64 -d "$D" -ctk q8_0 -ctv q8_0)
    fi
    "$L" --version 2>&1 | head -2 | sed 's/^/llama.cpp: /'
fi

printf '\n| test | strata tok/s | llama.cpp tok/s | ratio |\n|---|---|---|---|\n'
for t in pp512 pp4096 tg128 tg128_nograph tg64_d_f16 tg64_d_int8; do
    s=${ST[$t]:-}; l=${LL[$t]:-}
    r=""
    [ -n "$s" ] && [ -n "$l" ] && r=$(awk -v a="$s" -v b="$l" 'BEGIN { printf "%.2fx", a / b }')
    printf '| %s | %s | %s | %s |\n' "$t" "${s:--}" "${l:--}" "${r:--}"
done
echo
[ -n "$GB" ] && awk -v g="$GB" -v h="$HBM" 'BEGIN { printf "tg128 reads %.0f GB/s of weights = %.1f%% of the %d GB/s roofline\n", g, 100 * g / h, h }'
[ -n "${ST[tg64_d_f16]:-}" ] && [ -n "${ST[tg64_d_int8]:-}" ] &&
    awk -v a="${ST[tg64_d_int8]}" -v b="${ST[tg64_d_f16]}" -v d="$D" 'BEGIN { printf "decode at depth %d: int8 KV / f16 KV = %.2f\n", d, a / b }'
exit 0
