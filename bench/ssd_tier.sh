#!/usr/bin/env bash
# ssd_tier.sh: the host tiers of expert offload on a GPU machine (issue 15,
# item 2): Qwen3-30B-A3B's shape (strata synth, 19.8 GB) with a 12 GiB card
# emulated (--vram-budget 12) and 4 GiB of host RAM for the experts the card
# does not cache (--ram-budget 4): the hottest in a page-locked RAM tier, the
# rest read from the file by io_uring O_DIRECT. Runs, back to back:
#   tiers    --vram-budget 12 --ram-budget 4 (the page cache emptied of the
#            file first: posix_fadvise DONTNEED, and O_DIRECT bypasses it)
#   ram      --vram-budget 12, every host expert in RAM (the file read once
#            into the page cache first), the figure the tiers cost against
# each as prompt pp512 and decode tg64; prints the SSD tier's MB read per
# token, its read rate, and beside it the disk's sequential O_DIRECT rate
# that the start log measured with the same reads (the limit: rate / MB per
# token), and after the tiers run how much of the file the page cache holds
# (fincore, when util-linux has it: the SSD tier must not be there).
#
# usage: bench/ssd_tier.sh STRATA_BIN [DIR]
#   DIR: where the synth goes (default: the current directory). It must be
#   a disk: tmpfs (/dev/shm) is RAM, and refuses O_DIRECT.
# env: REPS (3), PROFILE (an expert profile for --expert-profile, optional),
#      RAM_GIB (4), VRAM_GIB (12). With 8 GiB every host expert fit in RAM
#      (the card caches 55% at 12 GiB): nothing was left for the SSD tier.
set -uo pipefail
if [ $# -lt 1 ]; then
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
S=$1
DIR=${2:-$PWD}
R=${REPS:-3}
RAM=${RAM_GIB:-4}
VRAM=${VRAM_GIB:-12}
M=$DIR/strata-ssd-tier-q30.gguf
fs=$(stat -f -c %T "$DIR")
if [ "$fs" = tmpfs ]; then
    echo "ssd_tier.sh: $DIR is tmpfs (RAM): give a directory on a disk" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/card: /'
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $DIR on $fs ($(df -h --output=source "$DIR" | tail -1))"
if [ ! -f "$M" ]; then
    t0=$(date +%s)
    "$S" synth --preset qwen3-30b-a3b -o "$M" --quiet || exit 1
    echo "synth: $M written in $(( $(date +%s) - t0 )) s"
fi
echo "model: $M ($(du -h "$M" | cut -f1))"
prof=()
[ -n "${PROFILE:-}" ] && prof=(--expert-profile "$PROFILE")

drop() { # the file out of the page cache (written or read before)
    python3 -c "import os,sys; f=os.open(sys.argv[1], os.O_RDONLY); os.fdatasync(f); os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)" "$M"
}
cached() { command -v fincore >/dev/null && fincore -b "$M" | tail -1 | awk '{printf "%.2f GB of the file in the page cache\n", $1 / 1e9}'; }
num() { grep -oE "$1[^:]*: [0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }
sb() { "$S" bench -m "$M" --gpu 0 -r "$R" -p 512 -n 64 --vram-budget "$VRAM" "${prof[@]}" "$@" 2>&1 | tee -a /tmp/strata_ssd_tier.log; }

echo "== tiers: --vram-budget $VRAM --ram-budget $RAM (page cache dropped)"
drop
cached | sed 's/^/  before: /'
out=$(sb --ram-budget "$RAM")
echo "$out" | grep -E "memory plan|RAM tier|SSD tier|expert lanes|page-locked|O_DIRECT refused|io_uring refused|pp512|tg64|experts in decode" | sed 's/^/  /'
cached | sed 's/^/  after: /'
tiers_tg=$(echo "$out" | num tg64)
tiers_pp=$(echo "$out" | num pp512)
seq=$(echo "$out" | grep -oE "sequential rate by the same reads: [0-9.]+" | grep -oE '[0-9.]+$')
mb=$(echo "$out" | grep -oE "SSD tier in decode: [0-9.]+ MB" | grep -oE '[0-9.]+')
rd=$(echo "$out" | grep -oE "MB read per token, [0-9.]+ GB/s" | grep -oE '[0-9.]+ GB' | grep -oE '[0-9.]+')

echo "== ram: --vram-budget $VRAM, every host expert in RAM"
cat "$M" >/dev/null
out=$(sb)
echo "$out" | grep -E "memory plan|pp512|tg64|experts in decode" | sed 's/^/  /'
ram_tg=$(echo "$out" | num tg64)
ram_pp=$(echo "$out" | num pp512)

echo "== summary"
printf "  decode tg64: tiers %s tok/s, all in RAM %s tok/s\n" "${tiers_tg:-?}" "${ram_tg:-?}"
printf "  prompt pp512: tiers %s tok/s, all in RAM %s tok/s\n" "${tiers_pp:-?}" "${ram_pp:-?}"
if [ -n "$mb" ] && [ -n "$seq" ]; then
    awk -v mb="$mb" -v rd="${rd:-0}" -v seq="$seq" -v t="${tiers_tg:-0}" 'BEGIN {
        printf "  SSD tier in decode: %.1f MB/token read at %.2f GB/s; the disk reads %.2f GB/s sequentially (O_DIRECT,\n", mb, rd, seq
        printf "  same reads): a decode limit of %.1f tok/s from the SSD alone; measured %.1f = %.0f%% of it\n", seq * 1e3 / mb, t, t > 0 ? 100 * t / (seq * 1e3 / mb) : 0 }'
fi
