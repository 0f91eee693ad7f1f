#!/usr/bin/env bash
# KV-cache compression cost on the random-weight SmolLM2-135M-shape model (Q8_0): for each
# press at ratio 0.5 and 0.9, KV bytes before/after, compression time, decode tokens/s over
# the compressed cache and peak RSS, one process per row (so the peak RSS is that press's).
# speckv and specpc draft with a 4-layer random model of the same shape and vocabulary
# (make-model --layers 4), about a seventh of the target's compute.
#   LENGTHS=16K,64K THREADS=2 NGEN=32 RATIOS="0.5 0.9" scripts/bench_press.sh
# FILL=backend prefills the prompt under that backend (bench press --fill-attn), e.g.
# FILL=infllm:sinks=4,local=64,topk=0 at 64K, where a dense prefill takes most of an hour per
# row; decoding stays dense. h2o is skipped then: its observer needs dense attention.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# LONGCTX=path runs that binary as it is (a long run then does not pick up later edits).
if [ -z "${LONGCTX:-}" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_BENCH=OFF >/dev/null
  cmake --build "$BUILD" --target longctx -j"$(nproc)" >&2
  LONGCTX=./$BUILD/longctx
fi
mkdir -p out/bench
vocab=tests/data/vocab/ggml-vocab-starcoder.gguf
m=out/bench/smol-q8_0.gguf
draft=out/bench/smol-draft4-q8_0.gguf
[ -f "$m" ] || "$LONGCTX" make-model --type q8_0 --vocab "$vocab" -o "$m"
[ -f "$draft" ] || "$LONGCTX" make-model --type q8_0 --layers 4 --seed 7 --vocab "$vocab" -o "$draft"
LENGTHS=${LENGTHS:-16K,64K}
THREADS=${THREADS:-2}
NGEN=${NGEN:-32}
RATIOS=${RATIOS:-"0.5 0.9"}
PRESSES=${PRESSES:-"snapkv h2o tova knorm expected_attention streaming_llm pyramidkv adakv random speckv specpc"}
FILL=${FILL:-}
HEADER=${HEADER:-1}
NONE=${NONE:-1}
fill=()
[ -n "$FILL" ] && fill=(--fill-attn "$FILL")
IFS=',' read -ra LENS <<< "$LENGTHS"
for L in "${LENS[@]}"; do
  hdr=(); [ "$HEADER" = 1 ] && hdr=(--header) && HEADER=0
  [ "$NONE" = 1 ] && "$LONGCTX" bench press -m "$m" -L "$L" -n "$NGEN" -t "$THREADS" "${fill[@]}" "${hdr[@]}" && hdr=()
  for p in $PRESSES; do
    if [ "$p" = h2o ] && [ -n "$FILL" ]; then
      echo "skipping h2o: its observer needs a dense prefill, not --fill-attn $FILL" >&2
      continue
    fi
    for r in $RATIOS; do
      extra=()
      case "$p" in speckv|specpc) extra=(--draft "$draft") ;; esac
      "$LONGCTX" bench press -m "$m" -L "$L" -n "$NGEN" -t "$THREADS" "${fill[@]}" "${hdr[@]}" \
        --kv-press "$p:ratio=$r" "${extra[@]}"
      hdr=()
    done
  done
done
