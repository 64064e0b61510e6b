#!/usr/bin/env bash
# kld_vs_llama.sh: KL divergence between Strata's and llama.cpp's logits on one
# GGUF file and one text, both ways, through llama.cpp's base-file format
# (`--kl-divergence-base`): llama-perplexity writes its logits and Strata reads
# them, Strata writes and llama-perplexity reads. A developer tool, not a CI
# test (CI has no llama.cpp build); record its table in docs/accuracy.md.
#
# usage: bench/kld_vs_llama.sh STRATA_BIN LLAMA_PERPLEXITY_BIN MODEL [CHUNKS] [TEXT]
#   STRATA_BIN             the `strata` binary
#   LLAMA_PERPLEXITY_BIN   an already built `llama-perplexity` (set LD_LIBRARY_PATH
#                          for its shared libraries; this script builds nothing)
#   MODEL                  the GGUF file both load
#   CHUNKS                 chunks of CTX tokens (default 4; llama.cpp wants a text
#                          of at least 2 chunks)
#   TEXT                   default tests/data/text/kjv-genesis.txt
# env: CTX (default 512), THREADS (default 2), WORK (a directory for the base
#      files, default a fresh mktemp -d, removed at the end unless KEEP=1;
#      they are n_chunks * (CTX/2 - 1) * n_vocab * 2 bytes: 535 MB for
#      Gemma 3's 262k vocabulary at 4 chunks), LLAMA_ARGS (extra arguments to
#      llama-perplexity, default --no-repack: its AMX repacked kernels die with
#      SIGILL on some VMs; the arithmetic is the same).
#
# Rows: "llama -> strata" is Strata (default, and with STRATA_PRECISE=1: f32
# activations) read against llama.cpp's file; "strata -> llama" is llama.cpp
# read against Strata's default file; the two "self" rows read each program's
# file with the same program, the floor set by the file's 16-bit rounding;
# "-fa off" is llama.cpp without flash attention read against its default run,
# the size of a change of its own attention rounding.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
STRATA=$1
LLAMA=$2
MODEL=$3
CHUNKS=${4:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TEXT=${5:-$ROOT/tests/data/text/kjv-genesis.txt}
CTX=${CTX:-512}
T=${THREADS:-2}
LLAMA_ARGS=${LLAMA_ARGS:---no-repack}
for f in "$STRATA" "$LLAMA"; do
    [ -x "$f" ] || { echo "kld_vs_llama.sh: '$f' is not an executable" >&2; exit 1; }
done
[ -r "$MODEL" ] || { echo "kld_vs_llama.sh: cannot read '$MODEL'" >&2; exit 1; }
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
[ "${KEEP:-0}" = 1 ] || trap 'rm -f "$WORK"/*.kld' EXIT
LB=$WORK/llama.kld
SB=$WORK/strata.kld

# shellcheck disable=SC2086
llama() { "$LLAMA" -m "$MODEL" -c "$CTX" -b "$CTX" -t "$T" $LLAMA_ARGS "$@"; }
strata() { "$STRATA" perplexity -m "$MODEL" --ctx "$CTX" -t "$T" "$@"; }

echo "# writing the base files ($CHUNKS chunks of $CTX)" >&2
llama -f "$TEXT" --chunks "$CHUNKS" --kl-divergence-base "$LB" > "$WORK/llama-write.log" 2>&1 ||
    { tail -n 20 "$WORK/llama-write.log" >&2; exit 1; }
strata -f "$TEXT" --chunks "$CHUNKS" --kl-divergence-base "$SB" > "$WORK/strata-write.log" 2>&1 ||
    { tail -n 20 "$WORK/strata-write.log" >&2; exit 1; }
cmp -s <(head -c $((20 + 4 * CHUNKS * CTX)) "$LB") <(head -c $((20 + 4 * CHUNKS * CTX)) "$SB") ||
    echo "# NOTE: the two files' headers or tokens differ (tokenization?)" >&2

# One row of the table from a --kl-divergence log (both print the same lines).
row() {
    local name=$1 log=$2
    local ppl pplb kld kmax top rms
    ppl=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$log")
    pplb=$(sed -n 's/^Mean PPL(base) *: *\([0-9.]*\).*/\1/p' "$log")
    kld=$(sed -n 's/^Mean    KLD: *\([-0-9.]* ± *[0-9.]*\).*/\1/p' "$log")
    kmax=$(sed -n 's/^Maximum KLD: *\([-0-9.]*\).*/\1/p' "$log")
    rms=$(sed -n 's/^RMS Δp *: *\([0-9.]* ± *[0-9.]*\) %.*/\1/p' "$log")
    top=$(sed -n 's/^Same top p: *\([0-9.]* ± *[0-9.]*\) %.*/\1/p' "$log")
    if [ -z "$kld" ]; then
        echo "kld_vs_llama.sh: no statistics in $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    printf '| %s | %s | %s | %s | %s | %s %% | %s %% |\n' "$name" "$ppl" "$pplb" "$kld" "$kmax" "$rms" "$top"
}

echo "# reading them" >&2
strata --kl-divergence-base "$LB" --kl-divergence -f "$TEXT" > "$WORK/s-reads-l.log" 2>&1 || true
STRATA_PRECISE=1 strata --kl-divergence-base "$LB" --kl-divergence > "$WORK/sp-reads-l.log" 2>&1 || true
llama --kl-divergence-base "$SB" --kl-divergence > "$WORK/l-reads-s.log" 2>&1 || true
llama --kl-divergence-base "$LB" --kl-divergence > "$WORK/l-reads-l.log" 2>&1 || true
llama --kl-divergence-base "$LB" --kl-divergence -fa off > "$WORK/lf-reads-l.log" 2>&1 || true
strata --kl-divergence-base "$SB" --kl-divergence > "$WORK/s-reads-s.log" 2>&1 || true
STRATA_PRECISE=1 strata --kl-divergence-base "$SB" --kl-divergence > "$WORK/sp-reads-s.log" 2>&1 || true

echo "$(basename "$MODEL"), $CHUNKS chunks of $CTX ($(( CHUNKS * (CTX - 1 - CTX / 2) )) positions), $(basename "$TEXT")"
echo
echo "| base -> run | PPL(run) | PPL(base) | mean KLD | max KLD | RMS Δp | same top p |"
echo "|---|---:|---:|---:|---:|---:|---:|"
row "llama.cpp -> Strata" "$WORK/s-reads-l.log"
row "llama.cpp -> Strata (STRATA_PRECISE=1)" "$WORK/sp-reads-l.log"
row "Strata -> llama.cpp" "$WORK/l-reads-s.log"
row "llama.cpp -> llama.cpp (self)" "$WORK/l-reads-l.log"
row "llama.cpp -> llama.cpp -fa off" "$WORK/lf-reads-l.log"
row "Strata -> Strata (self)" "$WORK/s-reads-s.log"
row "Strata -> Strata (STRATA_PRECISE=1)" "$WORK/sp-reads-s.log"

# The statistic itself, recomputed in NumPy from the two files: A || B is what
# Strata printed reading llama.cpp's file, B || A what llama.cpp printed.
echo
python3 "$ROOT/bench/kld_files.py" "$LB" "$SB" | sed 's/A ||/llama.cpp ||/; s/|| B/|| Strata/; s/B ||/Strata ||/; s/|| A/|| llama.cpp/'

# The bound: each engine rounds activations to 8 bits in its matrix products
# (llama.cpp's CPU backend always does; Strata unless STRATA_PRECISE=1), so
# each sits some KLD away from the f32-activation logits. Strata and llama.cpp
# may differ by at most the sum of those two distances, both measured here
# against Strata's f32-activation run (the closest to exact arithmetic either
# has); the same for the share of positions whose top-1 differs.
kld_of() { sed -n 's/^Mean    KLD: *\([-0-9.]*\).*/\1/p' "$1"; }
top_of() { sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$1"; }
awk -v k="$(kld_of "$WORK/s-reads-l.log")" -v k2="$(kld_of "$WORK/l-reads-s.log")" \
    -v kl="$(kld_of "$WORK/sp-reads-l.log")" -v ks="$(kld_of "$WORK/sp-reads-s.log")" \
    -v t="$(top_of "$WORK/s-reads-l.log")" -v tl="$(top_of "$WORK/sp-reads-l.log")" \
    -v ts="$(top_of "$WORK/sp-reads-s.log")" 'BEGIN {
    kb = kl + ks; tb = 100 - ((100 - tl) + (100 - ts));
    ok = (k <= kb && k2 <= kb && t >= tb);
    printf "\nbound: mean KLD <= %.6f (llama.cpp %.6f + Strata %.6f from f32 activations): %.6f and %.6f; ", kb, kl, ks, k, k2;
    printf "same top >= %.3f %%: %.3f %% -> %s\n", tb, t, ok ? "PASS" : "FAIL";
    exit !ok }'
