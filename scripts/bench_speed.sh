#!/usr/bin/env bash
# Engine-core speed on random-weight models of SmolLM2-135M's shape (F16, Q8_0, Q4_0), with the
# same settings as the llama.cpp figures in docs/performance.md: pp512 and tg64, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target longctx -j"$(nproc)"
mkdir -p out/bench
for t in f16 q8_0 q4_0; do
  m=out/bench/smollm2-135m-random-$t.gguf
  [ -f "$m" ] || ./build/longctx make-model --type "$t" --vocab tests/data/vocab/ggml-vocab-starcoder.gguf -o "$m"
  ./build/longctx bench speed -m "$m" -p 512 -n 64 -d "${DEPTHS:-0}" -r "${REPS:-3}" -t "${THREADS:-2}" "$@"
done
