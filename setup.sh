#!/usr/bin/env bash
# One command on a fresh Debian machine: installs the dependencies, builds
# Strata, fetches the default model and starts the main job.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p models
./build/bin/strata synth --preset tiny -o models/tiny-qwen3moe.gguf
./build/bin/strata info models/tiny-qwen3moe.gguf
