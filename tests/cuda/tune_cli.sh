#!/bin/sh
# `strata tune` from the command line on GPU 0 (CTest cuda_tune_cli, label gpu):
# tune a tiny synthetic model into $XDG_CACHE_HOME, check the table's header
# and lines, tune a second chunk size into the same table ("adding to"), then
# run a GPU bench whose prompt chunk is a tuned size and check that the engine
# names the table it loaded (one INFO line) and refuses nothing.
#   usage: tune_cli.sh STRATA
# Without a GPU: prints "SKIPPED: no CUDA device" and exits 0.
S=$1
if "$S" device --list-devices 2>&1 | grep -q "no GPU found"; then echo "SKIPPED: no CUDA device"; exit 0; fi
D=$(mktemp -d /tmp/strata-tune-cli.XXXXXX)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export XDG_CACHE_HOME=$D/cache
"$S" synth --preset tiny -o "$D/tiny.gguf" > /dev/null || fail "synth"
"$S" tune --gpu 0 -m "$D/tiny.gguf" -n 64 --algos 4 --reps 3 > "$D/t1.log" 2>&1
rc=$?
cat "$D/t1.log"
grep -q "not available in HIP" "$D/t1.log" && { echo "SKIPPED: no cuBLASLt (HIP)"; exit 0; }
[ $rc -eq 0 ] || fail "strata tune exited $rc"
T=$(ls "$D"/cache/strata/tune-sm*.tsv 2>/dev/null | head -1)
[ -n "$T" ] || fail "no table in $D/cache/strata"
echo "table: $T"
cat "$T"
head -1 "$T" | grep -q "^strata-tune v1	arch=sm_[0-9]*	cublaslt=[0-9]*	gpu=" || fail "bad header"
n1=$(grep -vc '^#' "$T")
# tiny: attn_q 256x256, attn_k/v 128x256, output 512x256 (the F32 router is left out): 3 shapes + header
[ "$n1" -eq 4 ] || fail "$n1 lines (want a header and 3 shapes)"
"$S" tune --gpu 0 -m "$D/tiny.gguf" -n 32 --algos 4 --reps 3 > "$D/t2.log" 2>&1 || { cat "$D/t2.log"; fail "second tune"; }
grep -q "^adding to $T" "$D/t2.log" || { cat "$D/t2.log"; fail "the second run did not add to the table"; }
n2=$(grep -vc '^#' "$T")
[ "$n2" -eq 7 ] || fail "$n2 lines after the second run (want 7)"
"$S" bench -m "$D/tiny.gguf" --gpu 0 --prefill 64 -p 64 -n 4 -r 1 > "$D/b.log" 2>&1 || { cat "$D/b.log"; fail "bench"; }
cat "$D/b.log"
[ "$(grep -c "tune table $T" "$D/b.log")" -eq 1 ] || fail "the engine did not name the table it loaded, once"
grep -q "refused" "$D/b.log" && fail "a tuned algorithm was refused"
echo "tune_cli: ok"
