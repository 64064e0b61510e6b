#!/usr/bin/env bash
# Runs every test: the release build's full CTest suite, then an ASan+UBSan
# clang build that runs the GGUF reader tests and its fuzzer for a bounded time.
# GPU tests (label gpu) skip with a message on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-models.sh
JOBS=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

CC=clang cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_FUZZ=ON >/dev/null
cmake --build build-san -j"$JOBS"
ctest --test-dir build-san --output-on-failure -L 'gguf|fuzz|tokenizer'

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

# HIP: the same kernel sources through compat.h with Debian's hipcc, for
# gfx1030 (RDNA2), compile only (no AMD GPU here).
scripts/check-hip.sh
