#!/usr/bin/env bash
# The project's C, CUDA and header sources against .clang-format, with
# Debian's clang-format 14 (scripts/install-deps.sh installs it; another
# version may format differently). Lists the files that differ and fails;
# `scripts/check-format.sh --fix` rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
if ! command -v "$CF" >/dev/null; then
    echo "check-format: $CF not found (scripts/install-deps.sh installs clang-format)" >&2
    exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
    "$CF" -i "${files[@]}"
    exit 0
fi
bad=()
for f in "${files[@]}"; do
    "$CF" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($("$CF" --version)):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "run scripts/check-format.sh --fix" >&2
    exit 1
fi
echo "check-format: ${#files[@]} files match .clang-format"
