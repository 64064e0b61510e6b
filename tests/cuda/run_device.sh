#!/bin/bash
# One device call for the GPU backend (issue 4): configure with STRATA_CUDA,
# build what the gpu-labelled tests need, list the devices, self-test GPU 0,
# run `ctest -L gpu` (less the matrix products' own test, run by their script), and time decode on a synthetic model. Logs to $OUT
# (at most 8 files come back): env.log, build.log, selftest.log, ctest.log, memcheck.log, bench.log.
#   usage (device machine, repo root): bash tests/cuda/run_device.sh [REGEX of gpu tests to leave out]
# If pkg-config or the -dev packages of PCRE2/jansson/libmicrohttpd are
# missing there, .devdeps/ (carried: headers, .pc files and libraries copied
# from the build host) stands in for them.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
J=16
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used,memory.total --format=csv; nvcc --version | tail -1;
  cat /etc/os-release | head -2; } > "$OUT/env.log" 2>&1
CM=()
if ! command -v pkg-config >/dev/null || ! pkg-config --exists libpcre2-8 jansson libmicrohttpd; then
  echo "using .devdeps for pkg-config / PCRE2 / jansson / libmicrohttpd" >> "$OUT/env.log"
  export PKG_CONFIG_LIBDIR=$PWD/.devdeps/pkgconfig LD_LIBRARY_PATH=$PWD/.devdeps/lib:${LD_LIBRARY_PATH:-}
  CM=(-DPKG_CONFIG_EXECUTABLE=$PWD/.devdeps/bin/pkg-config)
fi
B=build-gpu
T0=$(date +%s)
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${CM[@]}" > "$OUT/build.log" 2>&1 &&
  cmake --build $B -j$J --target strata_cli test_lanes test_picks test_batch \
    $(sed -n 's/^add_executable(\(test_[a-z0-9_]*\) .*/\1/p' tests/cuda/CMakeLists.txt) \
    $(cd tests/cuda && ls test_cuda_mm*.c 2>/dev/null | sed 's/\.c$//') >> "$OUT/build.log" 2>&1
rc=$?
echo "build rc $rc in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
S=$B/bin/strata
$S synth --preset tiny --zipf 1.0 -o /tmp/tiny.gguf > /dev/null 2>&1
{ $S device --list-devices; echo; $S device --selftest -m /tmp/tiny.gguf --max-context 4096; echo "selftest rc $?";
} > "$OUT/selftest.log" 2>&1
# The check at start against other architecture lists: device.cu rebuilt for
# sm_86 machine code only (must refuse a 9.0 card) and for compute_80 PTX
# only (must accept it, through the driver's JIT).
{ echo "== architecture check with other build lists"
  for v in "86-real:sm_86:refuse" "80-virtual:compute_80:accept"; do IFS=: read L A W <<< "$v"
    nvcc -std=c++17 -O2 -Isrc -gencode arch=compute_${L:0:2},code=$A -DSTRATA_GPU_ARCHS="\"$L\"" -c src/backend/cuda/device.cu -o /tmp/dev_$A.o &&
      gcc -std=c11 -Isrc tests/cuda/arch_refusal.c /tmp/dev_$A.o $B/src/libstrata.a -L/usr/local/cuda/lib64 -lcudart \
        -lstdc++ -lm -lpthread -o /tmp/arch_$A && /tmp/arch_$A $W; echo "  ($L, expect $W: rc $?)"
  done; } >> "$OUT/selftest.log" 2>&1
# the carried 6-layer SmolLM2 (tools/truncate_model.py; the full model cannot travel)
[ -f .e2e/smollm2-6l.gguf ] && cp .e2e/smollm2-6l.gguf $B/tests/cuda/
(cd $B && timeout 500 ctest -L gpu -E "test_cuda_mm${1:+|$1}" -V > "$OUT/ctest.log" 2>&1; echo "ctest rc $?" >> "$OUT/ctest.log")
# diagnosis: the same comparison on SmolLM2 cut to its first layer only (made
# here from the carried 6-layer copy when the gguf package travels along)
if [ -d .e2e/pylib ] && [ -f .e2e/smollm2-6l.gguf ]; then
  PYTHONPATH=.e2e/pylib python3 tools/truncate_model.py .e2e/smollm2-6l.gguf /tmp/smollm2-1l.gguf 0 &&
    $B/tests/cuda/test_cuda_e2e /tmp/smollm2-1l.gguf:1e-2 >> "$OUT/ctest.log" 2>&1
fi
# compute-sanitizer memcheck over a short end-to-end GPU test (it found
# shared-memory reads past attn_combine_kernel's slices, 2026-12-02)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$CS" ] && (cd $B/tests/cuda && timeout 240 "$CS" --tool memcheck --print-limit 20 ./test_cuda_gpt_oss . \
  > "$OUT/memcheck.log" 2>&1; echo "memcheck rc $?" >> "$OUT/memcheck.log")
{ for M in /tmp/tiny.gguf $B/tests/cuda/smollm2-6l.gguf; do for g in "" "--gpu 0"; do echo "== bench $M $g"; timeout 60 $S bench -m $M $g -p 128 -n 64 2>&1 | tail -4; done; done; } > "$OUT/bench.log" 2>&1
cat "$OUT/env.log"; grep -E "FAIL|selftest|pinned|FITS|GPU" "$OUT/selftest.log" | head -20
grep -E "FAIL|SKIPPED|prompt|then CPU|model\(s\)|gguf,|Test +#|tests passed|ctest rc" "$OUT/ctest.log" | head -70
grep -c "^ok " "$OUT/ctest.log"; grep -E "ERROR SUMMARY|memcheck rc" "$OUT/memcheck.log" 2>/dev/null; cat "$OUT/bench.log"
