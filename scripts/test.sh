#!/usr/bin/env bash
# Runs every test: the release build's full CTest suite, then ASan+UBSan clang
# builds for the GGUF reader, its fuzzer (bounded time) and the tokenizer, and
# for the server suites; then the CUDA and HIP compile checks.
# GPU tests (label gpu) skip with a message on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-models.sh
JOBS=$(nproc)

# STRATA_MPI explicitly: the layer split across MPI ranks (docs/multi.md) is built
# and its test (multi_mpi, mpirun -n 2 on the CPU) runs, or configuring fails
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_MPI=ON >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

CC=clang cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_FUZZ=ON >/dev/null
cmake --build build-san -j"$JOBS"
ctest --test-dir build-san --output-on-failure -L 'gguf|fuzz|tokenizer'

# The server under ASan+UBSan with leak checks (Release: under the Debug build
# the API suite outlasts its time limit). The suites' server helper fails a
# test on any sanitizer report in the server's log or a nonzero exit.
CC=clang cmake -S . -B build-san-server -DCMAKE_BUILD_TYPE=Release -DSTRATA_SANITIZE=ON >/dev/null
cmake --build build-san-server -j"$JOBS" --target server_tests
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-san-server --output-on-failure -L server

# CUDA: compile the kernels for the architectures CI must check (Hopper and
# Ampere consumer cards) and run the GPU tests, which skip with a message on a
# machine without a GPU.
if command -v nvcc >/dev/null; then
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90;86" >/dev/null
    cmake --build build-cuda -j"$JOBS"
    ctest --test-dir build-cuda --output-on-failure -L gpu
else
    echo "CUDA compile check skipped: nvcc is not installed on this machine"
fi

# HIP: the same kernel sources through compat.h with Debian's clang-19 and
# ROCm 5.2 libraries, for every AMD generation (gfx906, RDNA2, RDNA3,
# RDNA3.5, RDNA4: eight targets), compile only (no AMD GPU here); it also
# checks the offload bundles, wave sizes and int8 dot instructions.
scripts/check-hip.sh
