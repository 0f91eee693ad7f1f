#!/usr/bin/env bash
# The scale-out measurements (docs/scale-out.md): `longctx run` on one process and under
# `mpirun -np N --cp ring|star` on the project's model, one thread per rank, over a needle prompt
# of LEN tokens (RULER niah_single_1 at depth 50). Prints one markdown row per run: prefill
# seconds, decode ms per token, the largest per-rank KV cache and peak RSS, bytes sent per decoded
# token, and whether the answer was found. More ranks than cores share them: prefill time then
# measures the work, not a speed-up (the cost model in the docs takes per-rank compute from it).
# LEN (default 64K), RANKS (default "2 4"), MODES (default "ring star"), ATTN (default: the
# model's own), NGEN (default 32), MODEL (default: the shipped models/longctx-2l.gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longctx}
if [ "$BIN" = ./build/longctx ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target longctx -j"$(nproc)" >&2
fi
LEN=${LEN:-64K}
NGEN=${NGEN:-32}
out=out/scale
mkdir -p "$out"
p="$out/prompt-$LEN.txt"
if [ ! -f "$p" ]; then
  "$BIN" bench tasks --task niah_single_1 -L "$LEN" --depth 50 --show > "$out/show.txt"
  head -1 "$out/show.txt" | sed 's/.*answers: \[\(.*\)\]/\1/' > "$out/answer-$LEN.txt"
  printf '%s' "$(tail -n +2 "$out/show.txt")" > "$p"  # the prompt ends without a newline
fi
answer=$(cat "$out/answer-$LEN.txt")
attn=()
[ -n "${ATTN:-}" ] && attn=(--attn "$ATTN")
[ -n "${MODEL:-}" ] && attn+=(-m "$MODEL")
row() {  # label, log, stdout
  local log=$2 txt=$3
  local pre_tps pre_n gen_tps found kv rss bytes
  pre_n=$(grep -oP 'prompt:\s+\K[0-9]+' "$log")
  pre_tps=$(grep -oP 'prompt:.*= +\K[0-9.]+' "$log")
  gen_tps=$(grep -oP 'generation:.*= +\K[0-9.]+' "$log")
  if grep -q '^cp ' "$log"; then
    kv=$(grep -oP '^cp .*KV \K[0-9.]+' "$log" | sort -g | tail -1)
    rss=$(grep -oP '^cp .*peak RSS \K[0-9.]+' "$log" | sort -g | tail -1)
    bytes=$(grep -oP '^cp .*communication, \K[0-9]+' "$log" | paste -sd+ | bc)
  else
    kv=$(grep -oP 'KV cache \K[0-9.]+' "$log")
    rss=$(grep -oP 'peak RSS \K[0-9.]+' "$log")
    bytes=0
  fi
  found=no
  grep -q "$answer" "$txt" && found=yes
  awk -v l="$1" -v n="$pre_n" -v pt="$pre_tps" -v gt="$gen_tps" -v kv="$kv" -v rss="$rss" -v b="$bytes" \
      -v g="$NGEN" -v f="$found" 'BEGIN {
    printf "| %s | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %s |\n", l, n, n / pt, 1000 / gt, kv, rss, b / (n + g), f }'
}
echo "| run | prompt tokens | prefill s | decode ms/token | max KV per rank MiB | max peak RSS per rank MiB | bytes sent per token (all ranks) | needle |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
"$BIN" run -f "$p" -n "$NGEN" -t 1 --ignore-eos "${attn[@]}" > "$out/one.txt" 2> "$out/one.log"
row "1 process" "$out/one.log" "$out/one.txt"
for mode in ${MODES:-ring star}; do
  for np in ${RANKS:-2 4}; do
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$BIN" run -f "$p" -n "$NGEN" -t 1 --ignore-eos \
      --cp "$mode" --cp-timeout 3600 "${attn[@]}" > "$out/$mode$np.txt" 2> "$out/$mode$np.log" || {
      echo "| $mode, $np ranks | failed: $(grep -m1 'error\|longctx:' "$out/$mode$np.log") |"; continue; }
    row "$mode, $np ranks" "$out/$mode$np.log" "$out/$mode$np.txt"
  done
done
