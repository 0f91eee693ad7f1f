#!/usr/bin/env bash
# KV-cache compression cost on the random-weight SmolLM2-135M-shape model (Q8_0): for each
# press at ratio 0.5 and 0.9, KV bytes before/after, compression time, decode tokens/s over
# the compressed cache and peak RSS, one process per row (so the peak RSS is that press's).
# speckv drafts with the same model (make-model has only this shape, so no smaller random
# draft exists; a real pair would be e.g. SmolLM2-135M drafting for SmolLM2-1.7B).
#   LENGTHS=16K,64K THREADS=2 NGEN=32 RATIOS="0.5 0.9" scripts/bench_press.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_BENCH=OFF >/dev/null
cmake --build "$BUILD" --target longctx -j"$(nproc)" >&2
mkdir -p out/bench
m=out/bench/smol-q8_0.gguf
[ -f "$m" ] || "./$BUILD/longctx" make-model --type q8_0 --vocab tests/data/vocab/ggml-vocab-starcoder.gguf -o "$m"
LENGTHS=${LENGTHS:-16K,64K}
THREADS=${THREADS:-2}
NGEN=${NGEN:-32}
RATIOS=${RATIOS:-"0.5 0.9"}
PRESSES=${PRESSES:-"snapkv h2o tova knorm expected_attention streaming_llm pyramidkv adakv speckv"}
IFS=',' read -ra LENS <<< "$LENGTHS"
first=1
for L in "${LENS[@]}"; do
  hdr=(); [ $first = 1 ] && hdr=(--header) && first=0
  "./$BUILD/longctx" bench press -m "$m" -L "$L" -n "$NGEN" -t "$THREADS" "${hdr[@]}"
  for p in $PRESSES; do
    for r in $RATIOS; do
      extra=()
      [ "$p" = speckv ] && extra=(--draft "$m")
      "./$BUILD/longctx" bench press -m "$m" -L "$L" -n "$NGEN" -t "$THREADS" --kv-press "$p:ratio=$r" "${extra[@]}"
    done
  done
done
