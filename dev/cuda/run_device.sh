#!/bin/bash
# One device call for the matrix products (issue 4): build, test, lab, bench.
# Logs go to $OUT (at most 8 files come back): build.log, test_mm.log,
# lab_q4k.log, lab_q6k.log, bench.log, ctest.log.
#   usage (on the device machine, repo root): bash dev/cuda/run_device.sh [quick|full|nolab] [cmake]
# Without "cmake" only the modules the matrix products need are compiled
# (seconds, not minutes: device time is the scarce resource).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
J=16
CU="nvcc -std=c++17 -O3 -arch=sm_90 -Isrc"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv; nvcc --version | tail -1; } > "$OUT/build.log" 2>&1

# The library: CMake if it configures here, else the few modules the tests need by hand.
LIB=build/src/libstrata.a
if [ "${2:-}" != cmake ] || ! { cmake -S . -B build -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
       cmake --build build -j$J --target strata; } >> "$OUT/build.log" 2>&1; then
  echo "== building mm + quant + core by hand (no CMake, or it failed)" >> "$OUT/build.log"
  mkdir -p /tmp/mmobj && rm -f /tmp/mmobj/*.o
  for f in src/quant/*.c src/core/*.c; do
    fl=""; case $f in *_avx2.c) fl="-mavx2 -mfma -mf16c -mbmi2";; *_avx512.c) fl="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c -mbmi2";; esac
    gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc $fl -c $f -o /tmp/mmobj/$(basename $f).o &
  done
  for f in src/backend/cuda/mmv*.cu src/backend/cuda/gemm*.cu; do
    $CU -c $f -o /tmp/mmobj/$(basename $f).o &
  done
  wait
  ar rcs /tmp/libmm.a /tmp/mmobj/*.o && LIB=/tmp/libmm.a
fi
LIBS="$LIB -L/usr/local/cuda/lib64 -lcudart -lcublas -lcublasLt -lstdc++ -lm -lpthread"

# The format tests (also registered in tests/cuda/CMakeLists.txt when present).
gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -I/usr/local/cuda/include tests/cuda/test_cuda_mm.c \
  -o /tmp/test_cuda_mm $LIBS >> "$OUT/build.log" 2>&1
timeout 200 /tmp/test_cuda_mm > "$OUT/test_mm.log" 2>&1; echo "exit $?" >> "$OUT/test_mm.log"

# Kernel lab and benchmark.
if [ "${1:-}" != nolab ]; then
  $CU dev/cuda/mmv_q4k.cu -o /tmp/mmv_q4k >> "$OUT/build.log" 2>&1 &
  $CU dev/cuda/mmv_q6k.cu -o /tmp/mmv_q6k >> "$OUT/build.log" 2>&1 &
fi
$CU dev/cuda/bench_mm.cu -o /tmp/bench_mm $LIB -lcublas -lcublasLt >> "$OUT/build.log" 2>&1 &
wait
if [ "${1:-}" != nolab ]; then
  timeout 120 /tmp/mmv_q4k > "$OUT/lab_q4k.log" 2>&1
  timeout 120 /tmp/mmv_q6k > "$OUT/lab_q6k.log" 2>&1
fi
if [ "${1:-}" = quick ]; then timeout 150 /tmp/bench_mm --quick > "$OUT/bench.log" 2>&1
else timeout 200 /tmp/bench_mm > "$OUT/bench.log" 2>&1; fi

# Every gpu-labelled test of the tree, if the whole build goes through.
if [ "${2:-}" = cmake ] && [ -d build ] && cmake --build build -j$J >> "$OUT/build.log" 2>&1; then
  (cd build && timeout 150 ctest -L gpu --output-on-failure > "$OUT/ctest.log" 2>&1)
fi
tail -3 "$OUT/test_mm.log"; grep -c FAIL "$OUT/test_mm.log"
cat "$OUT"/lab_q*.log 2>/dev/null; cat "$OUT/bench.log"; tail -5 "$OUT/ctest.log" 2>/dev/null
