#!/usr/bin/env bash
# ab_builds.sh: several builds of Strata against each other in one run (a
# before/after, or a bisect done as parallel builds, e.g. in one GPU call):
# each source tree built side by side, then `strata bench` of each, the
# builds alternated ROUNDS times so that all see the same machine; prints
# every run and a table of the medians. Each build runs its own `strata
# bench`: trees from before 5dbc1df decode by feeding one token back, later
# ones draw random tokens, so compare decode only across trees on one side.
#
# usage: bench/ab_builds.sh --prepare DIR COMMIT...  (in the git checkout)
#          writes each commit's tree to DIR/COMMIT (git archive), to carry
#        bench/ab_builds.sh MODEL TREE...             (where it runs)
#          TREE: a source tree (DIR/COMMIT above, or . for the working tree)
# env: GPU (0: CUDA builds, `--gpu 0`; cpu: CPU builds), ARCH (90), ROUNDS
#      (2), PP (512), TG (128), DEPTH (16384; 0: none), CMAKE_ARGS (added to
#      each configure, e.g. the .devdeps pkg-config of tests/cuda/run_device.sh),
#      LIMIT (seconds for all the builds, 400).
# Per build and round: pp and tg (-r 2), then tg64 at DEPTH (-r 1).
set -uo pipefail
if [ "${1:-}" = --prepare ]; then
    [ $# -ge 3 ] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
    dir=$2
    shift 2
    for c in "$@"; do
        rm -rf "${dir:?}/$c" && mkdir -p "$dir/$c" && git archive "$c" | tar x -C "$dir/$c" || exit 1
        echo "$dir/$c: $(git log -1 --format='%h %s' "$c" | cut -c1-70)"
    done
    exit 0
fi
if [ $# -lt 2 ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
M=$1
shift
GPU=${GPU:-0} ARCH=${ARCH:-90} ROUNDS=${ROUNDS:-2} DEPTH=${DEPTH:-16384} LIMIT=${LIMIT:-400}
PP=${PP:-512} TG=${TG:-128}
if [ "$GPU" = cpu ]; then CONF=(-DSTRATA_CUDA=OFF) RUN=(); else CONF=(-DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH") RUN=(--gpu "$GPU"); fi
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
    (cmake -S "$t" -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release "${CONF[@]}" ${CMAKE_ARGS:-} &&
        timeout "$LIMIT" cmake --build $b -j"$jobs" --target strata_cli) > "$b.log" 2>&1 &
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
        out=$("$S" bench -m "$M" "${RUN[@]}" -p "$PP" -n "$TG" -r 2 2>&1)
        d=-
        [ "$DEPTH" -gt 0 ] && d=$("$S" bench -m "$M" "${RUN[@]}" -p 0 -n 64 -d "$DEPTH" -r 1 2>&1 | num tg64)
        p=$(echo "$out" | num "pp$PP") g=$(echo "$out" | num "tg$TG")
        echo "round $r ${names[$i]}: pp$PP $p, tg$TG $g, tg64 at $DEPTH $d"
        V[$i,pp]+="$p " V[$i,tg]+="$g " V[$i,d]+="$d "
    done
done
med() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{ a[NR] = $1 } END { print NR ? (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) : "-" }'; }
printf '\n| build | pp%s | tg%s | tg64 at %s |\n|---|---:|---:|---:|\n' "$PP" "$TG" "$DEPTH"
for i in $(seq 0 $((n - 1))); do
    printf '| %s | %s | %s | %s |\n' "${names[$i]}" "$(echo "${V[$i,pp]}" | med)" "$(echo "${V[$i,tg]}" | med)" \
        "$(echo "${V[$i,d]}" | med)"
done
