#!/usr/bin/env bash
# compare_cpu.sh: prompt (pp) and decode (tg) speed of Strata, llama.cpp and
# (when IK_BENCH names its llama-bench) ik_llama.cpp on one GGUF file,
# measured back to back in one run so all see the same machine load, printed
# as a Markdown table with Strata's ratio to each and to the better peer, and
# the limits strata bench measures beside it (read bandwidth for decode, the
# cores' int8 multiply-add rate for prompts).
#
# usage: bench/compare_cpu.sh STRATA_BIN LLAMA_BENCH_BIN MODEL [THREADS] [REPS]
#   STRATA_BIN       path to the `strata` binary (runs `strata bench`)
#   LLAMA_BENCH_BIN  path to an already built `llama-bench` (this script builds nothing)
#   MODEL            GGUF file both load
#   THREADS          threads for both (default 2)
#   REPS             repetitions for both (default 3; llama-bench reports the
#                    mean of its repetitions, strata bench the median)
# env: PP (default 512), TG (default 128) set the prompt and decode lengths;
#      LLAMA_ARGS / STRATA_ARGS add arguments to one side (e.g. LLAMA_ARGS="--repack 0");
#      IK_BENCH: ik_llama.cpp's llama-bench, run with IK_ARGS (default
#      "-fmoe 1 -rtr 1": fused MoE, rows repacked at load, its fast CPU path).
#
# Both tools use random prompt tokens and decode from an empty cache, so pp512
# and tg128 mean the same work. The load average before and after is printed:
# other jobs on the machine distort both sides (and not always equally).
# On a machine with more runnable jobs than cores, llama.cpp's OpenMP threads
# spin at every graph barrier while the other thread is descheduled (SmolLM2
# decode at load 13 on 2 cores: 0.45 tok/s, 50 with OMP_WAIT_POLICY=passive);
# the variable is passed through and printed, so set it and say so.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
STRATA=$1
LLAMA=$2
MODEL=$3
T=${4:-2}
R=${5:-3}
PP=${PP:-512}
TG=${TG:-128}

IK=${IK_BENCH:-}
IK_ARGS=${IK_ARGS:--fmoe 1 -rtr 1}
for f in "$STRATA" "$LLAMA" ${IK:+"$IK"}; do
    [ -x "$f" ] || { echo "compare_cpu.sh: '$f' is not an executable" >&2; exit 1; }
done
[ -r "$MODEL" ] || { echo "compare_cpu.sh: cannot read '$MODEL'" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# shellcheck disable=SC2086 # the *_ARGS are word lists on purpose
"$STRATA" bench -m "$MODEL" -p "$PP" -n "$TG" -t "$T" -r "$R" ${STRATA_ARGS:-} >"$tmp/strata.txt" 2>"$tmp/strata.err" || {
    echo "compare_cpu.sh: strata bench failed:" >&2; cat "$tmp/strata.err" >&2; exit 1; }
# shellcheck disable=SC2086
"$LLAMA" -m "$MODEL" -p "$PP" -n "$TG" -t "$T" -r "$R" -o json ${LLAMA_ARGS:-} >"$tmp/llama.json" 2>"$tmp/llama.err" || {
    echo "compare_cpu.sh: llama-bench failed:" >&2; tail -20 "$tmp/llama.err" >&2; exit 1; }
echo '[]' >"$tmp/ik.json"
if [ -n "$IK" ]; then
    # shellcheck disable=SC2086
    "$IK" -m "$MODEL" -p "$PP" -n "$TG" -t "$T" -r "$R" -o json $IK_ARGS >"$tmp/ik.json" 2>"$tmp/ik.err" || {
        echo "compare_cpu.sh: ik_llama.cpp's llama-bench failed:" >&2; tail -20 "$tmp/ik.err" >&2; exit 1; }
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp/strata.txt" "$tmp/llama.json" "$tmp/ik.json" "$MODEL" "$T" "$PP" "$TG" "$load_before" "$load_after" "$IK_ARGS" <<'EOF'
import json, os, re, sys
strata_txt, llama_json, ik_json, model, t, pp, tg, lb, la, ik_args = sys.argv[1:]
s = open(strata_txt).read()
def strata_rate(kind, n):
    m = re.search(r'^%s%s: ([0-9.]+) tok/s' % (kind, n), s, re.M)
    if not m:
        sys.exit('compare_cpu.sh: no %s%s line in strata bench output:\n%s' % (kind, n, s))
    return float(m.group(1))
def peer_rate(runs, who, n_prompt, n_gen):
    for r in runs:
        if r['n_prompt'] == n_prompt and r['n_gen'] == n_gen:
            return float(r['avg_ts']), float(r['stddev_ts']), r.get('build_commit', '?')
    sys.exit('compare_cpu.sh: %s printed no pp=%d tg=%d test' % (who, n_prompt, n_gen))
peers = [('llama.cpp', json.load(open(llama_json)))]
ik = json.load(open(ik_json))
if ik:
    peers.append(('ik_llama.cpp', ik))
pp, tg = int(pp), int(tg)
tests = ([('pp%d' % pp, 'pp', pp, (pp, 0))] if pp else []) + ([('tg%d' % tg, 'tg', tg, (0, tg))] if tg else [])
builds = ', '.join('%s %s' % (n, peer_rate(r, n, *tests[0][3])[2]) for n, r in peers) if tests else ''
print('model: %s, threads: %s, load average before: %s, after: %s; %s'
      % (os.path.basename(model), t, lb, la, builds))
if os.environ.get('OMP_WAIT_POLICY'):
    print('OMP_WAIT_POLICY=%s (the peers\' OpenMP threads)' % os.environ['OMP_WAIT_POLICY'])
extra = [(k, os.environ.get(k, '')) for k in ('LLAMA_ARGS', 'STRATA_ARGS')] + ([('IK_ARGS', ik_args)] if ik else [])
if any(v for _, v in extra):
    print('extra args: ' + ', '.join('%s %r' % kv for kv in extra if kv[1]))
m = re.search(r'^tg%d: .* of weights = ([0-9]+)%% of the ([0-9.]+) GB/s' % tg, s, re.M) if tg else None
if m:
    print('Strata decode: %s%% of the %s GB/s read bandwidth strata bench measured beside it' % m.groups())
m = re.search(r"^pp%d: .* = ([0-9]+)%% of the ([0-9.]+) GMAC/s that \d+ thread(?:'s|s') (\w+) int8" % pp, s, re.M) if pp else None
if m:
    print('Strata prompt: %s%% of the %s GMAC/s int8 multiply-add rate (%s) strata bench measured beside it'
          % m.groups())
print()
head = '| test | Strata tok/s | ' + ' | '.join('%s tok/s' % n for n, _ in peers) + ' | ' + \
       ' | '.join('Strata/%s' % n for n, _ in peers) + (' | Strata/better |' if len(peers) > 1 else ' |')
print(head)
print('|' + ' --- |' + ' ---: |' * (head.count('|') - 2))
for name, kind, n, key in tests:
    sr = strata_rate(kind, n)
    pr = [peer_rate(r, pn, *key) for pn, r in peers]
    cells = ['%.2f +/- %.2f' % (a, sd) for a, sd, _ in pr] + ['%.2fx' % (sr / a) for a, _, _ in pr]
    if len(peers) > 1:
        cells.append('%.2fx' % (sr / max(a for a, _, _ in pr)))
    print('| %s | %.2f | %s |' % (name, sr, ' | '.join(cells)))
EOF
