#!/usr/bin/env bash
# HIP compile-only check for every AMD generation Strata's users own: every
# src/backend/cuda/{,mm/,tune/}*.cu is compiled as HIP, once per file with all targets
# (one clang invocation, one --offload-arch each), from the same sources the
# CUDA build uses, through src/backend/cuda/compat.h. No GPU and no linking
# are needed. Targets (HIP_ARCHS to change):
#   gfx906 (Vega 20: Radeon VII, MI50/60; wave64), gfx1030 gfx1031 (RDNA2:
#   RX 6000), gfx1100 gfx1101 (RDNA3: RX 7000), gfx1151 (RDNA3.5: Strix
#   Halo), gfx1200 gfx1201 (RDNA4: RX 9000, Radeon AI PRO R9700).
#
# Toolchain: Debian bookworm's clang-19 + lld-19 with libamdhip64-dev (HIP
# 5.2 headers) and rocm-device-libs (ROCm 5.2 bitcode), installed by
# scripts/install-deps.sh --hip. Those device libraries stop at gfx1036; the
# one per-target file they lack for gfx11/gfx12 is generated into a
# build-local folder (scripts/hip-device-libs.sh). No prebuilt toolchain.
#
# Checked, each a line "ok"/"FAIL", warnings are errors throughout:
#  - every .cu compiles for every target (-Wall -Werror, C++17), and the
#    folder's .c files compile under STRATA_HIP;
#  - no kernel uses what would break its 32-lane logical warps on a wave64
#    target (ballots, lane masks, warpSize; compat.h says why);
#  - every object with kernels for AMD has an offload bundle holding code
#    objects for exactly the targets asked for (files whose kernels are all
#    CUDA-only, and host code, have none: they are named);
#  - per target, mmv_legacy's code object is an ELF for that gfx (its
#    e_flags), its kernels' metadata gives the target's wave size (64 on
#    gfx906, 32 else), and its int8 dot is the target's instruction:
#    v_dot4(c)_i32_i8 on gfx906 and RDNA2, v_dot4_i32_iu8 on RDNA3/3.5/4;
#  - the architecture list baked into device.cu (STRATA_GPU_ARCHS, what the
#    start-up check and --list-devices report) equals the bundled targets,
#    and the check's logic (tests/cuda/test_gpu_arch.c, built here) accepts
#    a card of each and refuses another one naming that list.
#
# Environment: HIP_ARCHS (space-separated), JOBS (parallel compiles, default
# 2), HIP_CHECK_KEEP=1 keeps the object folder. Ends with "hip compile
# check: N passed, M failed" and the time taken; non-zero exit on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)

read -r -a ARCHS <<<"${HIP_ARCHS:-gfx906 gfx1030 gfx1031 gfx1100 gfx1101 gfx1151 gfx1200 gfx1201}"
JOBS=${JOBS:-2}
LLVM_BIN=/usr/lib/llvm-19/bin
CXX=$LLVM_BIN/clang++

if ! inst=$(scripts/install-deps.sh --hip-only 2>&1) || [ ! -x "$CXX" ]; then
    echo "$inst" | tail -5
    echo "hip compile check: cannot install clang-19 / lld-19 / libamdhip64-dev / rocm-device-libs"
    echo "hip compile check: 0 passed, 1 failed"
    exit 1
fi

# HIP_CHECK_REUSE=DIR: the objects of a kept run are checked again, not
# rebuilt (for work on this script's checks only).
REUSE=${HIP_CHECK_REUSE:-}
OUT=${REUSE:-$(mktemp -d /tmp/strata-hip-check.XXXXXX)}
if [ -n "$REUSE" ]; then
    echo "checking the objects in $OUT again"
elif [ "${HIP_CHECK_KEEP:-0}" = 1 ]; then
    echo "objects kept in $OUT"
else
    trap 'rm -rf "$OUT"' EXIT
fi
DEVLIB=$(scripts/hip-device-libs.sh "$OUT/devlib" "${ARCHS[@]}") || {
    echo "hip compile check: cannot make the device-library folder"
    echo "hip compile check: 0 passed, 1 failed"
    exit 1
}
LIST=$(IFS=,; echo "${ARCHS[*]}")
echo "$("$CXX" --version | head -1), HIP headers $(dpkg-query -W -f='${Version}' libamdhip64-dev 2>/dev/null)," \
    "device libs $(dpkg-query -W -f='${Version}' rocm-device-libs 2>/dev/null); targets $LIST"

# The flags of the CMake HIP build (src/backend/cuda/CMakeLists.txt): C++17,
# warnings as errors, STRATA_HIP; no hipBLAS here, so compat.h compiles the
# GEMM path out exactly as a build without it would.
OFFLOAD=()
for a in "${ARCHS[@]}"; do OFFLOAD+=("--offload-arch=$a"); done
HIPFLAGS=(-c -x hip -std=c++17 --rocm-path=/usr --hip-device-lib-path="$DEVLIB" "${OFFLOAD[@]}" -O2 -Wall -Werror
          -DSTRATA_HIP=1 -D_GNU_SOURCE "-DSTRATA_GPU_ARCHS=\"$LIST\"" -Isrc)
CFLAGS=(-c -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -DSTRATA_HIP=1 -D__HIP_PLATFORM_AMD__=1 -Isrc)

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "  ok    $*"; }
bad() { fail=$((fail + 1)); echo "  FAIL  $*"; }

# One compile; writes its verdict line to $OUT/<name>.res, its log to .log.
compile_one() {
    local f=$1 base t0 t1 rc
    base=$(basename "$f")
    t0=$(date +%s.%N)
    case "$f" in
    *.cu) "$CXX" "${HIPFLAGS[@]}" "$f" -o "$OUT/$base.o" >"$OUT/$base.log" 2>&1 ;;
    *.c) cc "${CFLAGS[@]}" "$f" -o "$OUT/$base.o" >"$OUT/$base.log" 2>&1 ;;
    esac
    rc=$?
    t1=$(date +%s.%N)
    if [ $rc -eq 0 ] && [ ! -s "$OUT/$base.o" ]; then rc=1; echo "no object written" >>"$OUT/$base.log"; fi
    printf '%s %s %.1f\n' "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$f" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >"$OUT/$base.res"
}

# attention.cu first: it takes by far the longest (its many template
# instances, times eight targets), so it runs beside all the others.
FILES=(src/backend/cuda/attention.cu)
for f in src/backend/cuda/*.cu src/backend/cuda/*.c src/backend/cuda/mm/*.cu src/backend/cuda/tune/*.cu src/backend/cuda/tune/*.c; do
    [ "$f" = src/backend/cuda/attention.cu ] || FILES+=("$f")
done
for f in "${FILES[@]}"; do
    [ -n "$REUSE" ] && break
    compile_one "$f" &
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n 2>/dev/null || true; done
done
wait

for f in "${FILES[@]}"; do
    base=$(basename "$f")
    read -r verdict _ secs <"$OUT/$base.res"
    if [ "$verdict" = ok ]; then
        ok "$(printf '%-40s %6ss' "$f" "$secs")"
    else
        bad "$(printf '%-40s %6ss' "$f" "$secs")"
        grep -E 'error|warning' "$OUT/$base.log" | head -20 | sed 's/^/        /'
    fi
done

# Wave64: the kernels' 32-lane logical warps stay apart inside a 64-lane wave
# only while every cross-lane operation goes through compat.h's shuffles
# with width ST_WARP. Anything that sees the whole wave would break it.
# (HIP's own __shfl* names, without _sync, would take the 64-lane default.)
# Code under `#if !defined(STRATA_HIP)` (the PTX kernels) is not compiled
# for AMD and is skipped, as are comment lines and device.cu's host-side
# p->warpSize.
# One pass over the sources as HIP sees them: "HIT file:line: text" for a
# whole-wave operation, "KERNEL file" for each __global__ compiled for AMD.
scan=$(awk '
    FNR == 1 { depth = 0; skip = 0 }
    /^[ \t]*#[ \t]*if/ {
        depth++
        cuda[depth] = ($0 ~ /!defined\(STRATA_HIP\)|!ST_GPU_IS_HIP/)            # CUDA-only branch
        hipif[depth] = !cuda[depth] && ($0 ~ /defined\(STRATA_HIP\)|ST_GPU_IS_HIP/) # its #else is CUDA-only
        if (cuda[depth]) skip++
        next
    }
    /^[ \t]*#[ \t]*(else|elif)/ {
        if (cuda[depth]) { cuda[depth] = 0; skip-- } else if (hipif[depth]) { hipif[depth] = 0; cuda[depth] = 1; skip++ }
        next
    }
    /^[ \t]*#[ \t]*endif/ { if (cuda[depth]) skip--; depth--; next }
    /^[ \t]*(\*|\/\/|\/\*)/ || skip > 0 { next }
    /__global__/ { print "KERNEL " FILENAME }
    /__ballot|__activemask|__any(_sync)?\(|__all(_sync)?\(|__lane_id|__match_|__reduce_[a-z]+_sync|warpSize|__shfl(_xor|_up|_down)?\(/ {
        if (!(FILENAME ~ /device\.cu$/ && $0 ~ /p(->|\.)warpSize/)) print "HIT " FILENAME ":" FNR ": " $0
    }' src/backend/cuda/*.cu src/backend/cuda/*.cuh src/backend/cuda/mm/*.cu src/backend/cuda/mm/*.cuh src/backend/cuda/tune/*.cu src/backend/cuda/tune/*.cuh)
hits=$(echo "$scan" | sed -n 's/^HIT //p')
if [ -z "$hits" ]; then
    ok "no ballots, lane masks or warpSize in the AMD kernels (wave64-safe logical warps)"
else
    bad "kernels use whole-wave operations that break 32-lane logical warps on wave64:"
    echo "$hits" | head -10 | sed 's/^/        /'
fi

# The offload bundles: exactly the asked targets, each an ELF for its gfx,
# with its wave size.
BUNDLER=$LLVM_BIN/clang-offload-bundler
want=$(printf '%s\n' "${ARCHS[@]}" | sort | tr '\n' ' ')
nobj=0
badobj=()
hostonly=()
for f in src/backend/cuda/*.cu src/backend/cuda/mm/*.cu src/backend/cuda/tune/*.cu; do
    o="$OUT/$(basename "$f").o"
    [ -s "$o" ] || continue
    # a file without kernels on HIP (the PTX-only ones, host code) has no bundle
    sections=$("$LLVM_BIN/llvm-readelf" -S "$o")
    if [[ "$sections" != *" .hip_fatbin "* ]]; then
        [[ "$scan" == *"KERNEL $f"* ]] && badobj+=("$(basename "$f"): kernels for AMD but no bundle")
        hostonly+=("$(basename "$f" .cu)")
        continue
    fi
    nobj=$((nobj + 1))
    "$LLVM_BIN/llvm-objcopy" --dump-section=.hip_fatbin="$o.fatbin" "$o" "$OUT/scratch.o" 2>/dev/null
    got=$("$BUNDLER" --list --type=o --input="$o.fatbin" 2>/dev/null | sed -n 's/^hipv4-amdgcn-amd-amdhsa--//p' | sort | tr '\n' ' ')
    [ "$got" = "$want" ] || badobj+=("$(basename "$f"): bundle holds [$got]")
done
if [ "$nobj" -gt 0 ] && [ ${#badobj[@]} -eq 0 ]; then
    ok "$nobj objects bundle code objects for exactly: $want(no kernels on HIP: ${hostonly[*]})"
else
    bad "offload bundles differ from the asked targets ($want; $nobj objects):"
    printf '        %s\n' "${badobj[@]}" | head -10
fi

LEG="$OUT/mmv_legacy.cu.o"
if [ -s "$LEG.fatbin" ]; then
    for a in "${ARCHS[@]}"; do
        co="$OUT/mmv_legacy.$a.co"
        "$BUNDLER" --unbundle --type=o --input="$LEG.fatbin" --targets="hipv4-amdgcn-amd-amdhsa--$a" --output="$co" 2>/dev/null
        mach=$("$LLVM_BIN/llvm-readelf" -h "$co" 2>/dev/null | sed -n 's/^ *Flags: *0x[0-9a-fA-F]*, *\([a-z0-9]*\).*/\1/p')
        waves=$("$LLVM_BIN/llvm-readelf" --notes "$co" 2>/dev/null | sed -n 's/^ *\.wavefront_size: *//p' | sort -u | tr '\n' ' ')
        case "$a" in gfx9*) wwave="64 " dot='v_dot4c?_i32_i8' lab=v_dot4_i32_i8 ;;
                     gfx103*) wwave="32 " dot='v_dot4c?_i32_i8' lab=v_dot4c_i32_i8 ;;
                     *) wwave="32 " dot='v_dot4_i32_iu8' lab=v_dot4_i32_iu8 ;; esac
        ndot=$("$LLVM_BIN/llvm-objdump" -d "$co" 2>/dev/null | grep -cE "$dot\b")
        if [ "$mach" = "$a" ] && [ "$waves" = "$wwave" ] && [ "$ndot" -gt 0 ]; then
            ok "$(printf 'mmv_legacy for %-8s ELF %s, wave%s, %5d x %s' "$a" "$mach" "${waves% }" "$ndot" "$lab")"
        else
            bad "mmv_legacy for $a: ELF mach '$mach', wave sizes '$waves' (want ${wwave% }), $ndot x $dot"
        fi
    done
else
    bad "mmv_legacy.cu has no offload bundle to inspect"
fi

# The list the binary reports against the code it carries.
DEV="$OUT/device.cu.o"
if [ -s "$DEV.fatbin" ] &&
    cc -std=c11 -Wall -Wextra -Werror -Isrc tests/cuda/test_gpu_arch.c src/backend/cuda/device_arch.c \
        -o "$OUT/test_gpu_arch" >"$OUT/test_gpu_arch.log" 2>&1; then
    # the longest gfx list among the object's strings (a string may carry a
    # byte before it; the bundle's own names are single entries)
    baked=$("$LLVM_BIN/llvm-strings" "$DEV" | grep -oE '(gfx[0-9a-f]+,)*gfx[0-9a-f]+' | awk '{ print length, $0 }' |
        sort -rn | head -1 | cut -d' ' -f2)
    mapfile -t bundled < <("$BUNDLER" --list --type=o --input="$DEV.fatbin" 2>/dev/null | sed -n 's/^hipv4-amdgcn-amd-amdhsa--//p')
    if [ "$baked" = "$LIST" ] && "$OUT/test_gpu_arch" --list "$baked" "${bundled[@]}" >"$OUT/test_gpu_arch.out" 2>&1; then
        ok "device.cu reports '$baked'; each of its ${#bundled[@]} bundled targets accepted, others refused naming it"
    else
        bad "device.cu: baked list '$baked' (asked '$LIST'), bundled '${bundled[*]}':"
        sed 's/^/        /' "$OUT/test_gpu_arch.out" 2>/dev/null | head -12
    fi
else
    bad "device.cu's bundle or the test_gpu_arch build is missing"
    sed 's/^/        /' "$OUT/test_gpu_arch.log" 2>/dev/null | head -12
fi

echo "hip compile check: $pass passed, $fail failed ($(( $(date +%s) - T0 )) s, ${#ARCHS[@]} targets, $JOBS jobs)"
[ "$fail" -eq 0 ]
