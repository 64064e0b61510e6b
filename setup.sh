#!/usr/bin/env bash
# One command on a fresh Debian machine: installs the dependencies, builds
# Strata, fetches the default model and starts the main job.
#
# An AMD GPU is found in the kernel's KFD topology (one node per CPU and
# GPU; a GPU node's gfx_target_version is major*10000 + minor*100 +
# stepping, e.g. 110000 for gfx1100, 90010 for gfx90a): then the HIP
# toolchain is installed too and build-hip/ is built for exactly the
# architectures of the cards found (docs/amd.md). STRATA_HIP_ARCHS
# overrides the detection ("gfx1100;gfx1201"; empty for none).
# `./setup.sh --amd-archs` prints what it detects and stops (tested with a
# made-up topology under STRATA_KFD_TOPOLOGY: tests/cuda/setup_amd.sh).
set -euo pipefail
cd "$(dirname "$0")"

# gfx names of the AMD GPUs present, one per line, each once.
amd_archs() {
    local f v
    for f in "${STRATA_KFD_TOPOLOGY:-/sys/class/kfd/kfd/topology}"/nodes/*/properties; do
        [ -r "$f" ] || continue
        v=$(awk '$1 == "gfx_target_version" { print $2 }' "$f")
        [ -n "$v" ] && [ "$v" -gt 0 ] 2>/dev/null || continue
        printf 'gfx%d%x%x\n' $((v / 10000)) $((v / 100 % 100)) $((v % 100))
    done | sort -u
}

HIP_ARCHS=${STRATA_HIP_ARCHS-$(amd_archs | paste -sd';')}
if [ "${1:-}" = --amd-archs ]; then
    echo "$HIP_ARCHS"
    exit 0
fi
if [ -n "$HIP_ARCHS" ]; then
    echo "setup: AMD GPU found ($HIP_ARCHS): the HIP build goes to build-hip/"
    scripts/install-deps.sh --hip
else
    scripts/install-deps.sh
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
if [ -n "$HIP_ARCHS" ]; then
    # The CPU build above stays the main job's: the HIP build has never run
    # on a real Radeon (docs/amd.md). A failure here leaves the CPU build.
    if cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=Release -DSTRATA_HIP=ON -DCMAKE_HIP_ARCHITECTURES="$HIP_ARCHS" >/dev/null &&
        cmake --build build-hip -j"$(nproc)" --target strata_cli; then
        echo "setup: build-hip/bin/strata has code for $HIP_ARCHS; try it with --gpu 0 (strata device --list-devices)"
    else
        echo "setup: the HIP build for $HIP_ARCHS failed; continuing with the CPU build (docs/amd.md)" >&2
    fi
fi
scripts/fetch-models.sh
# the main job: chat with the default model (SmolLM2-135M-Instruct) on the CPU
exec ./build/bin/strata chat "$@"
