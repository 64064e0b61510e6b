#!/bin/sh
# Models for test_cuda_e2e (see tests/cuda/CMakeLists.txt): three tiny synthetic
# qwen3moe files, two gpt-oss ones, and SmolLM2 cut to 6 layers when the full model is fetched.
#   usage: make_e2e_models.sh STRATA PYTHON SOURCE_DIR OUT_DIR
set -e
S=$1 PY=$2 SRC=$3 OUT=$4
"$S" synth --preset tiny --zipf 1.0 -o "$OUT/synth-tiny.gguf" > /dev/null
"$S" synth --preset tiny --zipf 1.0 --type-default Q8_0 -o "$OUT/synth-tiny-q8.gguf" > /dev/null
"$S" synth --preset tiny --zipf 1.0 --type-default F32 -o "$OUT/synth-tiny-f32.gguf" > /dev/null
echo "made $OUT/synth-tiny.gguf, synth-tiny-q8.gguf and synth-tiny-f32.gguf"
# gpt-oss (sinks, biased experts, the clamped SwiGLU): as published (MXFP4 experts, Q8_0) and all F32
"$S" synth --arch gpt-oss --preset tiny -o "$OUT/synth-oss-tiny.gguf" > /dev/null
"$S" synth --arch gpt-oss --preset tiny --type-default F32 -o "$OUT/synth-oss-tiny-f32.gguf" > /dev/null
echo "made $OUT/synth-oss-tiny.gguf and synth-oss-tiny-f32.gguf"
FULL=$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$FULL" ] && [ -n "$PY" ]; then
    "$PY" "$SRC/tools/truncate_model.py" "$FULL" "$OUT/smollm2-6l.gguf" 0,1,2,27,28,29
    echo "made $OUT/smollm2-6l.gguf (layers 0-2 and 27-29 of $FULL)"
else
    echo "no $FULL: the 6-layer SmolLM2 is not made (a carried copy in $OUT is used if present)"
fi
