#!/usr/bin/env bash
# Instruction counts of the engine's forward pass, a regression guard that a noisy machine
# cannot blur: callgrind counts the instructions of one 64-token prefill chunk and of one
# decoded token (only inside Context::forward_chunk; loading and set-up are not counted), on
# the small golden models (MODELS= names others; a 135M model takes minutes). One thread,
# so that no spin-wait is counted. Valgrind does not run AVX-512, so the counts are of the
# plain AVX2 build (LONGCTX_NATIVE=OFF) in build-callgrind/. docs/performance.md records them;
# compare a change's counts with the counts of its parent commit, run the same way.
#
#   bash scripts/callgrind_counts.sh            # all models
#   MODELS="tests/data/golden/models/llama_quant_q8_0.gguf" bash scripts/callgrind_counts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
  echo "callgrind_counts: needs valgrind (apt-get install valgrind)" >&2
  exit 1
fi
build=${BUILD:-build-callgrind}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_NATIVE=OFF -DLONGCTX_TESTS=OFF \
  -DLONGCTX_BENCH=OFF >/dev/null
cmake --build "$build" --target longctx >/dev/null

g=tests/data/golden/models
default_models="$g/stories260K.gguf $g/llama_gqa_f16.gguf $g/llama_quant_q8_0.gguf $g/llama_quant_q4_0.gguf \
$g/llama_quant_q4_k.gguf $g/llama_quant_q6_k.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

count() {  # model, bench speed arguments -> instructions inside forward_chunk
  local out="$tmp/cg.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='lc::Context::forward_chunk*' \
    "./$build/longctx" bench speed -m "$1" "${@:2}" -r 1 --no-warmup --no-limits -t 1 >/dev/null 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}

echo "| model | prefill chunk of 64 (Ir) | per prompt token | one decoded token (Ir) |"
echo "|---|---:|---:|---:|"
for m in ${MODELS:-$default_models}; do
  pp=$(count "$m" -p 64 -n 0)
  tg=$(count "$m" -p 0 -n 1)
  printf '| %s | %s | %s | %s |\n' "$(basename "$m")" "$pp" "$((pp / 64))" "$tg"
done
