#!/usr/bin/env bash
# compare_cpu.sh: prompt (pp) and decode (tg) speed of Strata and llama.cpp on
# one GGUF file, measured back to back in one run so both see the same machine
# load, printed as a Markdown table with the ratio Strata/llama.cpp.
#
# usage: bench/compare_cpu.sh STRATA_BIN LLAMA_BENCH_BIN MODEL [THREADS] [REPS]
#   STRATA_BIN       path to the `strata` binary (runs `strata bench`)
#   LLAMA_BENCH_BIN  path to an already built `llama-bench` (this script builds nothing)
#   MODEL            GGUF file both load
#   THREADS          threads for both (default 2)
#   REPS             repetitions for both (default 3; llama-bench reports the
#                    mean of its repetitions, strata bench the median)
# env: PP (default 512), TG (default 128) set the prompt and decode lengths;
#      LLAMA_ARGS / STRATA_ARGS add arguments to one side (e.g. LLAMA_ARGS="--repack 0").
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
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
STRATA=$1
LLAMA=$2
MODEL=$3
T=${4:-2}
R=${5:-3}
PP=${PP:-512}
TG=${TG:-128}

for f in "$STRATA" "$LLAMA"; do
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
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp/strata.txt" "$tmp/llama.json" "$MODEL" "$T" "$PP" "$TG" "$load_before" "$load_after" <<'EOF'
import json, os, re, sys
strata_txt, llama_json, model, t, pp, tg, lb, la = sys.argv[1:]
s = open(strata_txt).read()
def strata_rate(kind, n):
    m = re.search(r'^%s%s: ([0-9.]+) tok/s' % (kind, n), s, re.M)
    if not m:
        sys.exit('compare_cpu.sh: no %s%s line in strata bench output:\n%s' % (kind, n, s))
    return float(m.group(1))
runs = json.load(open(llama_json))
def llama_rate(n_prompt, n_gen):
    for r in runs:
        if r['n_prompt'] == n_prompt and r['n_gen'] == n_gen:
            return float(r['avg_ts']), float(r['stddev_ts']), r.get('build_commit', '?')
    sys.exit('compare_cpu.sh: llama-bench printed no pp=%d tg=%d test' % (n_prompt, n_gen))
pp, tg = int(pp), int(tg)
rows = []
if pp:
    rows.append(('pp%d' % pp, strata_rate('pp', pp), llama_rate(pp, 0)))
if tg:
    rows.append(('tg%d' % tg, strata_rate('tg', tg), llama_rate(0, tg)))
commit = rows[0][2][2] if rows else '?'
print('model: %s, threads: %s, load average before: %s, after: %s, llama.cpp build %s'
      % (os.path.basename(model), t, lb, la, commit))
if os.environ.get('OMP_WAIT_POLICY'):
    print('OMP_WAIT_POLICY=%s (llama.cpp\'s OpenMP threads)' % os.environ['OMP_WAIT_POLICY'])
if os.environ.get('LLAMA_ARGS') or os.environ.get('STRATA_ARGS'):
    print('extra args: llama-bench %r, strata bench %r'
          % (os.environ.get('LLAMA_ARGS', ''), os.environ.get('STRATA_ARGS', '')))
print()
print('| test | Strata tok/s | llama.cpp tok/s | Strata/llama.cpp |')
print('| --- | ---: | ---: | ---: |')
for name, sr, (lr, lsd, _) in rows:
    print('| %s | %.2f | %.2f +/- %.2f | %.2fx |' % (name, sr, lr, lsd, sr / lr))
EOF
