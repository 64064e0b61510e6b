#!/usr/bin/env bash
# ab_cuda.sh: several builds of Strata against each other on one GPU in one
# run (a before/after, or a bisect done as parallel builds): each source
# tree built for CUDA side by side, then `strata bench --gpu 0` of each,
# the builds alternated ROUNDS times so that all see the same machine;
# prints every run and a table of the medians.
#
# usage: bench/ab_cuda.sh --prepare DIR COMMIT...   (here, in the git checkout)
#          writes each commit's tree to DIR/COMMIT (git archive), to carry
#        bench/ab_cuda.sh MODEL TREE...              (on the GPU machine)
#          TREE: a source tree (DIR/COMMIT above, or . for the working tree)
# env: ARCH (90), ROUNDS (2), DEPTH (16384), CMAKE_ARGS (added to each
#      configure, e.g. the .devdeps pkg-config of tests/cuda/run_device.sh),
#      LIMIT (seconds for all the builds, 400).
# Per build and round: pp512 and tg128 (-r 2), then tg64 at DEPTH (-r 1).
set -uo pipefail
if [ "${1:-}" = --prepare ]; then
    [ $# -ge 3 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
    dir=$2
    shift 2
    for c in "$@"; do
        rm -rf "${dir:?}/$c" && mkdir -p "$dir/$c" && git archive "$c" | tar x -C "$dir/$c" || exit 1
        echo "$dir/$c: $(git log -1 --format='%h %s' "$c" | cut -c1-70)"
    done
    exit 0
fi
if [ $# -lt 2 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
M=$1
shift
ARCH=${ARCH:-90} ROUNDS=${ROUNDS:-2} DEPTH=${DEPTH:-16384} LIMIT=${LIMIT:-400}
n=$#
jobs=$(( $(nproc) / n ))
[ "$jobs" -ge 1 ] || jobs=1
names=()
i=0
for t in "$@"; do
    name=$(basename "$(cd "$t" && pwd)")
    [ "$t" = . ] && name=tree
    names+=("$name")
    b=build-ab-$i
    # shellcheck disable=SC2086 # CMAKE_ARGS is a word list on purpose
    (cmake -S "$t" -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
        ${CMAKE_ARGS:-} && timeout "$LIMIT" cmake --build $b -j"$jobs" --target strata_cli) > "$b.log" 2>&1 &
    i=$((i + 1))
done
wait
for i in $(seq 0 $((n - 1))); do
    [ -x "build-ab-$i/bin/strata" ] || { echo "build of ${names[$i]} failed:"; tail -5 "build-ab-$i.log"; exit 1; }
done
num() { grep -oE "^$1[^:]*: [0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }
declare -A V
for r in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
        S=build-ab-$i/bin/strata
        out=$("$S" bench -m "$M" --gpu 0 -p 512 -n 128 -r 2 2>&1)
        d=$("$S" bench -m "$M" --gpu 0 -p 0 -n 64 -d "$DEPTH" -r 1 2>&1 | num tg64)
        p=$(echo "$out" | num pp512) g=$(echo "$out" | num tg128)
        echo "round $r ${names[$i]}: pp512 $p, tg128 $g, tg64 at $DEPTH $d"
        V[$i,pp]+="$p " V[$i,tg]+="$g " V[$i,d]+="$d "
    done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
printf '\n| build | pp512 | tg128 | tg64 at %s |\n|---|---:|---:|---:|\n' "$DEPTH"
for i in $(seq 0 $((n - 1))); do
    printf '| %s | %s | %s | %s |\n' "${names[$i]}" "$(echo "${V[$i,pp]}" | med)" "$(echo "${V[$i,tg]}" | med)" \
        "$(echo "${V[$i,d]}" | med)"
done
