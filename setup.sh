#!/usr/bin/env bash
# One command on a fresh Debian machine: installs the dependencies, builds
# Strata, fetches the default model and starts the main job.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
scripts/fetch-models.sh
# the main job: chat with the default model (SmolLM2-135M-Instruct) on the CPU
exec ./build/bin/strata chat "$@"
