#!/usr/bin/env bash
# Installs everything Strata builds and tests with on Debian: apt packages
# and the pip packages the tests use. Idempotent: a second run only checks.
set -euo pipefail

APT_PKGS=(build-essential cmake clang libclang-rt-14-dev pkg-config python3 python3-pip
          libpcre2-dev libjansson-dev libmicrohttpd-dev libutf8proc-dev liburing-dev chromium)
PIP_PKGS=(numpy gguf pytest openai anthropic playwright)

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

PY=${PYTHON:-python3}
if ! $PY -c "import numpy, gguf, pytest, openai, anthropic, playwright" 2>/dev/null; then
    echo "setup: installing pip packages: ${PIP_PKGS[*]}"
    $PY -m pip install -q "${PIP_PKGS[@]}" 2>/dev/null || $PY -m pip install -q --break-system-packages "${PIP_PKGS[@]}"
fi
