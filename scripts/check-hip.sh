#!/usr/bin/env bash
# HIP compile-only check: every src/backend/cuda/*.cu is compiled as HIP for
# an AMD target (gfx1030, RDNA2, wave32 by default) with Debian's hipcc, the
# same sources the CUDA build uses, through src/backend/cuda/compat.h. No GPU
# and no linking are needed; this shows that the kernels stay portable.
#
# Also checked: the host .c files of the folder under STRATA_HIP (their
# headers' HIP branch), and that a wave64 target (gfx90a) is refused by
# compat.h at compile time, since the kernels assume 32-lane warps.
#
# Environment: HIP_ARCH (default gfx1030), JOBS (parallel compiles, default
# 2), HIP_CHECK_KEEP=1 keeps the object folder. hipcc is installed with apt
# when missing (Debian bookworm: hipcc 5.2.3, clang 15, ROCm device libs).
# Prints one line per file and ends with "hip compile check: N passed, M
# failed"; the exit status is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

ARCH=${HIP_ARCH:-gfx1030}
JOBS=${JOBS:-2}

if ! command -v hipcc >/dev/null 2>&1; then
    echo "hipcc not found: installing it with apt-get (Debian package hipcc)"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
    if ! command -v apt-get >/dev/null 2>&1 ||
        ! { $SUDO apt-get install -y hipcc >/dev/null 2>&1 ||
            { $SUDO apt-get update >/dev/null 2>&1 && $SUDO apt-get install -y hipcc >/dev/null 2>&1; }; }; then
        echo "hip compile check: cannot install hipcc (needs apt-get and root)"
        echo "hip compile check: 0 passed, 1 failed"
        exit 1
    fi
fi
echo "hipcc: $(hipcc --version 2>/dev/null | grep -m1 'HIP version'), $(hipcc --version 2>/dev/null | grep -m1 'clang version'), target $ARCH"

OUT=$(mktemp -d /tmp/strata-hip-check.XXXXXX)
if [ "${HIP_CHECK_KEEP:-0}" = 1 ]; then
    echo "objects kept in $OUT"
else
    trap 'rm -rf "$OUT"' EXIT
fi

# The flags of the CMake HIP build (src/backend/cuda/CMakeLists.txt): C++17,
# warnings as errors, STRATA_HIP; no hipBLAS here, so compat.h compiles the
# GEMM path out exactly as a build without it would.
HIPFLAGS=(-c -x hip -std=c++17 --offload-arch="$ARCH" -O2 -Wall -Werror -DSTRATA_HIP=1 -D_GNU_SOURCE
          "-DSTRATA_GPU_ARCHS=\"$ARCH\"" -Isrc)
CFLAGS=(-c -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -DSTRATA_HIP=1 -D__HIP_PLATFORM_AMD__=1 -Isrc)

# One compile; writes its verdict line to $OUT/<name>.res, its log to .log.
compile_one() {
    local f=$1 base t0 t1 rc
    base=$(basename "$f")
    t0=$(date +%s.%N)
    case "$f" in
    *.cu) hipcc "${HIPFLAGS[@]}" "$f" -o "$OUT/$base.o" >"$OUT/$base.log" 2>&1 ;;
    *.c) cc "${CFLAGS[@]}" "$f" -o "$OUT/$base.o" >"$OUT/$base.log" 2>&1 ;;
    esac
    rc=$?
    t1=$(date +%s.%N)
    # a compile that "succeeds" without an object with device code is no pass
    if [ $rc -eq 0 ] && [ ! -s "$OUT/$base.o" ]; then rc=1; echo "no object written" >>"$OUT/$base.log"; fi
    printf '%s %s %.1f\n' "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$f" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >"$OUT/$base.res"
}

FILES=(src/backend/cuda/*.cu src/backend/cuda/*.c)
pids=()
for f in "${FILES[@]}"; do
    compile_one "$f" &
    pids+=($!)
    # keep at most JOBS compiles running
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n 2>/dev/null || true; done
done
wait

pass=0
fail=0
for f in "${FILES[@]}"; do
    base=$(basename "$f")
    read -r verdict _ secs <"$OUT/$base.res"
    if [ "$verdict" = ok ]; then
        pass=$((pass + 1))
        printf '  ok    %-40s %5ss\n' "$f" "$secs"
    else
        fail=$((fail + 1))
        printf '  FAIL  %-40s %5ss\n' "$f" "$secs"
        grep -E 'error|warning' "$OUT/$base.log" | head -20 | sed 's/^/        /'
    fi
done

# Device code really is there for the target, and in wave32.
if [ -s "$OUT/mmv_legacy.cu.o" ]; then
    if hipcc -std=c++17 --offload-arch="$ARCH" --cuda-device-only -S -x hip -DSTRATA_HIP=1 -Isrc \
        src/backend/cuda/mmv_legacy.cu -o "$OUT/mmv_legacy.s" >/dev/null 2>&1 &&
        grep -q 'amdhsa_wavefront_size32 1' "$OUT/mmv_legacy.s"; then
        pass=$((pass + 1))
        echo "  ok    device code for $ARCH is wave32 ($(grep -c 'v_dot4' "$OUT/mmv_legacy.s") dot4 instructions in mmv_legacy)"
    else
        fail=$((fail + 1))
        echo "  FAIL  mmv_legacy.cu device assembly for $ARCH is missing or not wave32"
    fi
fi

# A wave64 target must be refused by compat.h with its message.
if hipcc "${HIPFLAGS[@]/--offload-arch=$ARCH/--offload-arch=gfx90a}" src/backend/cuda/device.cu \
    -o "$OUT/wave64.o" >"$OUT/wave64.log" 2>&1; then
    fail=$((fail + 1))
    echo "  FAIL  a wave64 target (gfx90a) compiled; compat.h should refuse it"
elif grep -q '32-lane waves' "$OUT/wave64.log"; then
    pass=$((pass + 1))
    echo "  ok    a wave64 target (gfx90a) is refused: $(grep -m1 -o '32-lane waves[^"]*' "$OUT/wave64.log" | cut -c1-60)..."
else
    fail=$((fail + 1))
    echo "  FAIL  gfx90a failed for another reason than the wave-size guard:"
    grep -m5 error "$OUT/wave64.log" | sed 's/^/        /'
fi

echo "hip compile check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
