#!/usr/bin/env bash
# strata synth writes a tiny qwen3moe file and strata info reads it back:
# every tensor class of the architecture appears in the summary, the totals
# line is there, and the CLI's exit codes hold (0 ok, 1 bad file, 2 usage).
set -u
BIN=$1
DIR=$2
F=$DIR/synth_info_tiny.gguf
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" synth --preset tiny -o "$F" --quiet || fail "synth exited $?"
[ -s "$F" ] || fail "no file written"
out=$("$BIN" info "$F") || fail "info exited $?"
for c in token_embd output_norm output attn_norm attn_q attn_k attn_v attn_output attn_q_norm attn_k_norm \
         ffn_norm ffn_gate_inp ffn_gate_exps ffn_up_exps ffn_down_exps; do
    echo "$out" | grep -Eq "^  $c +[0-9]+ +(F32|Q4_K|Q6_K) +[0-9]+ +[0-9]+ +[0-9.]+$" ||
        fail "class $c missing from strata info"
done
echo "$out" | grep -q '^total: 3806720 params' || fail "totals line (tiny has 3806720 weights)"
echo "$out" | grep -q 'general.architecture *str *"qwen3moe"' || fail "architecture key"
n=$("$BIN" info "$F" --tensors | grep -c '^  blk\.')
[ "$n" = 24 ] || fail "--tensors lists $n block tensors, want 24"
echo "checked: 15 classes, totals, --tensors lists all 27 tensors"

"$BIN" synth --help >/dev/null || fail "synth --help exit $?"
"$BIN" info --help >/dev/null || fail "info --help exit $?"
err=$("$BIN" synth --preset tiny -o "$F" --foo 2>&1); rc=$?
[ $rc = 2 ] || fail "unknown option exit $rc"
echo "$err" | head -1 | grep -qx "strata synth: unknown option '--foo'" || fail "message: $err"
echo "$err" | sed -n 2p | grep -q '^usage: strata synth' || fail "usage line: $err"
"$BIN" synth --preset tiny --ctx >/dev/null 2>&1; [ $? = 2 ] || fail "missing value should exit 2"
head -c 100 "$F" > "$DIR/synth_info_trunc.gguf"
err=$("$BIN" info "$DIR/synth_info_trunc.gguf" 2>&1); rc=$?
[ $rc = 1 ] || fail "truncated file exit $rc"
[ "$(echo "$err" | wc -l)" = 1 ] || fail "error should be one line: $err"
echo "checked: --help 0, unknown option/missing value 2, bad file 1 ($err)"
