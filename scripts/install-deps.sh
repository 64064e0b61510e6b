#!/usr/bin/env bash
# Installs everything Strata builds and tests with on Debian: apt packages
# and the pip packages the tests use. Idempotent: a second run only checks.
#   --hip       also the AMD (HIP) toolchain: clang-19 + lld-19 (with llvm-19
#               and clang-tools-19 for llvm-as/llvm-dis and the offload
#               bundler, libclang-rt-19-dev for the CMake HIP build's
#               builtins), libamdhip64-dev (HIP 5.2 headers and runtime) and
#               rocm-device-libs (ROCm 5.2 bitcode; scripts/hip-device-libs.sh
#               adds what it lacks for gfx11/gfx12). All Debian bookworm.
#   --hip-only  only those (scripts/check-hip.sh)
set -euo pipefail

HIP=0
BASE=1
for a in "$@"; do
    case "$a" in
    --hip) HIP=1 ;;
    --hip-only) HIP=1 BASE=0 ;;
    *) echo "usage: install-deps.sh [--hip | --hip-only]" >&2; exit 2 ;;
    esac
done

APT_PKGS=(build-essential cmake clang clang-format libclang-rt-14-dev pkg-config python3 python3-pip
          libpcre2-dev libjansson-dev libmicrohttpd-dev libutf8proc-dev liburing-dev chromium
          libopenmpi-dev openmpi-bin)
PIP_PKGS=(numpy gguf pytest openai anthropic playwright)
HIP_PKGS=(clang-19 lld-19 llvm-19 clang-tools-19 libclang-rt-19-dev libamdhip64-dev rocm-device-libs)
[ "$BASE" = 1 ] || APT_PKGS=()
[ "$HIP" = 0 ] || APT_PKGS+=("${HIP_PKGS[@]}")

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing apt packages: ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "$BASE" = 1 ] || exit 0
PY=${PYTHON:-python3}
if ! $PY -c "import numpy, gguf, pytest, openai, anthropic, playwright" 2>/dev/null; then
    echo "setup: installing pip packages: ${PIP_PKGS[*]}"
    $PY -m pip install -q "${PIP_PKGS[@]}" 2>/dev/null || $PY -m pip install -q --break-system-packages "${PIP_PKGS[@]}"
fi
