#!/usr/bin/env bash
# Makes a device-library folder for clang's HIP compiles (its
# --hip-device-lib-path) that covers every AMD target asked for, out of
# Debian's ROCm 5.2 bitcode (package rocm-device-libs) and nothing else.
#
# Why: those libraries stop at gfx1036. For a newer target (gfx1100,
# gfx1151, gfx1201, ...) clang links oclc_isa_version_<N>.bc, which holds a
# single constant, __oclc_ISA_version (major*1000 + minor*100 + stepping:
# 10300 for gfx1030, 9006 for gfx906), and finds no such file. This script
# links every Debian .bc into DIR and writes the missing ones with llvm-as,
# from the exact form of an existing one (llvm-dis of oclc_isa_version_1030:
# same data layout, triple and linkage, only the number differs). Nothing
# else in the libraries is per target: ocml/ockl branch on that constant.
#
#   usage: scripts/hip-device-libs.sh DIR gfx906 gfx1100 ...
# Prints DIR on success. Idempotent; DIR is build-local (never /usr).
# Environment: ROCM_BITCODE (default: the first /usr/lib/*/amdgcn/bitcode),
# LLVM_BIN (default /usr/lib/llvm-19/bin).
set -euo pipefail

DIR=${1:?usage: hip-device-libs.sh DIR ARCH...}
shift
LLVM_BIN=${LLVM_BIN:-/usr/lib/llvm-19/bin}
SRC=${ROCM_BITCODE:-$(ls -d /usr/lib/*/amdgcn/bitcode 2>/dev/null | head -1)}
if [ -z "$SRC" ] || [ ! -f "$SRC/ocml.bc" ]; then
    echo "hip-device-libs: no ROCm device libraries found (Debian package rocm-device-libs)" >&2
    exit 1
fi
for t in llvm-as llvm-dis; do
    [ -x "$LLVM_BIN/$t" ] || { echo "hip-device-libs: $LLVM_BIN/$t missing (Debian package llvm-19)" >&2; exit 1; }
done

mkdir -p "$DIR"
for f in "$SRC"/*.bc; do
    ln -sfn "$f" "$DIR/$(basename "$f")"
done

# The model: an existing ISA-version library, disassembled.
MODEL="$SRC/oclc_isa_version_1030.bc"
HEAD=$("$LLVM_BIN/llvm-dis" "$MODEL" -o - | grep -E '^target (datalayout|triple) = ')
DECL=$("$LLVM_BIN/llvm-dis" "$MODEL" -o - | grep -E '^@__oclc_ISA_version = ')
case "$DECL" in
*" i32 10300,"*) ;;
*) echo "hip-device-libs: unexpected form of $MODEL: $DECL" >&2; exit 1 ;;
esac

for arch in "$@"; do
    # gfx<major><minor><stepping>: the last two characters are minor and
    # stepping, hex digits (gfx90a: 9, 0, 10).
    n=${arch#gfx}
    [[ "$n" =~ ^[0-9]+[0-9a-f][0-9a-f]$ ]] || { echo "hip-device-libs: not a gfx name: $arch" >&2; exit 1; }
    [ -e "$DIR/oclc_isa_version_$n.bc" ] && continue
    major=${n:0:${#n}-2}
    minor=$((16#${n:${#n}-2:1}))
    step=$((16#${n:${#n}-1:1}))
    ver=$((major * 1000 + minor * 100 + step))
    { echo "$HEAD"; echo "${DECL/ i32 10300,/ i32 $ver,}"; } >"$DIR/oclc_isa_version_$n.ll"
    "$LLVM_BIN/llvm-as" "$DIR/oclc_isa_version_$n.ll" -o "$DIR/oclc_isa_version_$n.bc.tmp"
    mv "$DIR/oclc_isa_version_$n.bc.tmp" "$DIR/oclc_isa_version_$n.bc"
done
echo "$DIR"
