#!/bin/bash
# Batched serving on one GPU, Strata against llama-server (issue 17 item 14):
# for each slot count N, `strata serve --slots N` and `llama-server -np N`
# (the same slots, the same context per slot) on the same file, each loaded
# with N concurrent streaming clients (bench/load_server.py, ignore_eos, so
# every answer is MAXTOK tokens), one after the other. Prints aggregate
# tok/s and time to first token p50/p99 per server and the ratios.
#   usage: bench/compare_serve.sh STRATA LLAMA_SERVER MODEL.gguf
#   env: COUNTS ("4 8 16 32"), REQS (requests per client, 2), MAXTOK (256),
#        CTX (context per slot, 1024), TEMP (0.7), PORT (18300),
#        STRATA_ARGS ("--gpu 0"), LLAMA_ARGS ("-ngl 99 -fa on"),
#        STRATA_B (a second Strata build, run after the first: an A/B column),
#        LLAMA=0 (leave llama-server out)
set -u
S=$1 L=$2 M=$3
COUNTS=${COUNTS:-4 8 16 32} REQS=${REQS:-2} MAXTOK=${MAXTOK:-256} CTX=${CTX:-1024} TEMP=${TEMP:-0.7}
PORT=${PORT:-18300} STRATA_ARGS=${STRATA_ARGS---gpu 0} LLAMA_ARGS=${LLAMA_ARGS--ngl 99 -fa on}
HERE=$(cd "$(dirname "$0")" && pwd)
LOAD=(python3 "$HERE/load_server.py" --url http://127.0.0.1:$PORT --max-tokens "$MAXTOK" --temperature "$TEMP" --ignore-eos)

wait_up() { # pid: 0 once /health answers 200, 1 if the server died or 300 s passed
  for _ in $(seq 600); do
    kill -0 "$1" 2>/dev/null || return 1
    [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && return 0
    sleep 0.5
  done
  return 1
}

run_one() { # name n command...: start, warm up, load, stop; prints "json {...}" of the load
  local name=$1 n=$2; shift 2
  "$@" > /tmp/serve-$name-$n.log 2>&1 &
  local pid=$!
  if ! wait_up $pid; then echo "$name N=$n: did not come up"; tail -5 /tmp/serve-$name-$n.log; kill $pid 2>/dev/null; return; fi
  "${LOAD[@]}" --clients "$n" --requests 1 --max-tokens 8 --tag "Warm-up." > /dev/null 2>&1 # every slot once
  "${LOAD[@]}" --clients "$n" --requests "$REQS" --tag "Measured." --json | sed "s/^/  $name N=$n: /"
  kill -TERM $pid; wait $pid 2>/dev/null
}

NAMES="strata${STRATA_B:+ strata-b}$([ "${LLAMA:-1}" = 0 ] || echo ' llama')"
declare -A TOK TTFT50 TTFT99
for n in $COUNTS; do
  for name in $NAMES; do
    if [ $name != llama ]; then
      bin=$S; [ $name = strata-b ] && bin=$STRATA_B
      out=$(run_one $name $n "$bin" serve -m "$M" $STRATA_ARGS --slots $n --queue $((2 * n)) -c $CTX --port $PORT)
    else
      out=$(run_one llama $n "$L" -m "$M" $LLAMA_ARGS -np $n -c $((n * CTX)) --port $PORT --no-warmup)
    fi
    echo "$out" | grep -v "  $name N=$n: json"
    j=$(echo "$out" | sed -n "s/^  $name N=$n: json //p")
    [ -n "$j" ] || continue
    TOK[$name$n]=$(echo "$j" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["tok_s"])')
    TTFT50[$name$n]=$(echo "$j" | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["ttft_p50_ms"])')
    TTFT99[$name$n]=$(echo "$j" | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["ttft_p99_ms"])')
  done
done
echo
ratio() { [ -n "$1" ] && [ -n "$2" ] && python3 -c "print('%.2fx' % ($1 / $2))" || echo -; }
head="| streams |"; rule="|---:|"
for name in $NAMES; do head="$head $name tok/s | $name TTFT p50 / p99 ms |"; rule="$rule---:|---:|"; done
for name in $NAMES; do [ $name = llama ] || { head="$head $name / llama |"; rule="$rule---:|"; }; done
echo "$head"; echo "$rule"
for n in $COUNTS; do
  row="| $n |"
  for name in $NAMES; do row="$row ${TOK[$name$n]:--} | ${TTFT50[$name$n]:--} / ${TTFT99[$name$n]:--} |"; done
  for name in $NAMES; do [ $name = llama ] || row="$row $(ratio "${TOK[$name$n]:-}" "${TOK[llama$n]:-}") |"; done
  echo "$row"
done
