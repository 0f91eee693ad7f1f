#!/usr/bin/env bash
# Star Attention's error against exact attention (docs/scale-out.md): RULER niah_single_1 on the
# project's model at several lengths, SAMPLES samples each (depths drawn from RULER's 40), read
# by one process (exact), and by `--cp star` on 2 and 4 ranks. Prints the fraction of samples
# whose answer contains the needle's value, per length and run. LENGTHS (default
# "4K 8K 16K 32K"), SAMPLES (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longctx}
if [ "$BIN" = ./build/longctx ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target longctx -j"$(nproc)" >&2
fi
SAMPLES=${SAMPLES:-10}
out=out/star-accuracy
mkdir -p "$out"
echo "| length | samples | one process (exact) | star, 2 ranks | star, 4 ranks |"
echo "|---:|---:|---:|---:|---:|"
for L in ${LENGTHS:-4K 8K 16K 32K}; do
  "$BIN" bench tasks --task niah_single_1 -L "$L" --samples "$SAMPLES" --show > "$out/show-$L.txt"
  # One prompt file and one answer file per sample (the prompt ends without a newline).
  awk -v dir="$out" -v L="$L" '
    /^=== / { if (f) close(f); n++; f = sprintf("%s/%s-%d.txt", dir, L, n);
              a = $0; sub(/.*answers: \[/, "", a); sub(/\].*/, "", a);
              print a > sprintf("%s/%s-%d.ans", dir, L, n); first = 1; next }
    { if (!first) printf "\n" > f; printf "%s", $0 > f; first = 0 }' "$out/show-$L.txt"
  one=0 s2=0 s4=0 n=0
  for p in "$out/$L"-*.txt; do
    a=$(cat "${p%.txt}.ans")
    printf '%s' "$(cat "$p")" > "$p.tmp" && mv "$p.tmp" "$p"  # no newline after the prompt
    n=$((n + 1))
    "$BIN" run -f "$p" -n 12 -t 2 2>/dev/null | grep -q "$a" && one=$((one + 1)) || true
    mpirun --oversubscribe --allow-run-as-root -np 2 "$BIN" run -f "$p" -n 12 -t 1 --cp star 2>/dev/null \
      | grep -q "$a" && s2=$((s2 + 1)) || true
    mpirun --oversubscribe --allow-run-as-root -np 4 "$BIN" run -f "$p" -n 12 -t 1 --cp star 2>/dev/null \
      | grep -q "$a" && s4=$((s4 + 1)) || true
  done
  echo "| $L | $n | $one/$n | $s2/$n | $s4/$n |"
done
