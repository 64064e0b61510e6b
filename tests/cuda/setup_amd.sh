#!/bin/sh
# setup.sh's AMD detection on a made-up KFD topology: a CPU node (version
# 0), an RX 7900 XTX (110000), a Strix Halo iGPU (110501), a Radeon VII
# (90006), an MI210 (90010, a hex stepping) and a second 7900 XTX: one name
# per architecture, sorted, ';'-joined (CMake's list). No node: nothing.
#   usage: setup_amd.sh REPO_ROOT
set -eu
ROOT=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
node() { mkdir -p "$T/nodes/$1"; printf 'cpu_cores_count %s\ngfx_target_version %s\nsimd_count 0\n' "$3" "$2" >"$T/nodes/$1/properties"; }
node 0 0 16
node 1 110000 0
node 2 110501 0
node 3 90006 0
node 4 90010 0
node 5 110000 0
got=$(STRATA_KFD_TOPOLOGY=$T "$ROOT/setup.sh" --amd-archs)
want="gfx1100;gfx1151;gfx906;gfx90a"
echo "detected: '$got'"
[ "$got" = "$want" ] || { echo "FAIL: want '$want'"; exit 1; }
got=$(STRATA_KFD_TOPOLOGY=$T/none "$ROOT/setup.sh" --amd-archs)
[ -z "$got" ] || { echo "FAIL: no topology gave '$got'"; exit 1; }
got=$(STRATA_KFD_TOPOLOGY=$T STRATA_HIP_ARCHS="gfx1201" "$ROOT/setup.sh" --amd-archs)
[ "$got" = gfx1201 ] || { echo "FAIL: STRATA_HIP_ARCHS not taken: '$got'"; exit 1; }
echo "setup_amd: ok"
