#!/usr/bin/env bash
# Engine-core speed on random-weight models (longctx make-model), with the same settings as the
# llama.cpp figures in docs/performance.md: pp512 and tg64, 2 threads. SHAPE is smollm2-135m
# (default; StarCoder's vocabulary) or qwen2.5-0.5b (Qwen2's); TYPES the weight types, plain
# (f16 q8_0 q4_0, the default) or llama.cpp's mixtures (q4_k_m q5_k_m q6_k).
#   SHAPE=qwen2.5-0.5b TYPES="f16 q4_k_m" bash scripts/bench_speed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${SHAPE:-smollm2-135m}
TYPES=${TYPES:-f16 q8_0 q4_0}
case "$SHAPE" in
  smollm2-135m) vocab=tests/data/vocab/ggml-vocab-starcoder.gguf ;;
  qwen2.5-0.5b) vocab=tests/data/vocab/ggml-vocab-qwen2.gguf ;;
  *) echo "bench_speed: SHAPE must be smollm2-135m or qwen2.5-0.5b, not '$SHAPE'" >&2; exit 1 ;;
esac
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target longctx -j"$(nproc)"
mkdir -p out/bench
for t in $TYPES; do
  m=out/bench/$SHAPE-random-$t.gguf
  [ -f "$m" ] || ./build/longctx make-model --shape "$SHAPE" --type "$t" --vocab "$vocab" -o "$m"
  ./build/longctx bench speed -m "$m" -p 512 -n 64 -d "${DEPTHS:-0}" -r "${REPS:-3}" -t "${THREADS:-2}" "$@"
done
